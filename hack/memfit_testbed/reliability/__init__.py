"""Chaos harness and scenario library of the reliability tier, shared by tests/reliability and benchmarks."""
