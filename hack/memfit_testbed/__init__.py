"""memfit's test bed: local control plane, KWOK GPU pools, pod runner, operator process and fault kit.

A dev-only package (installed by `hack/venv.sh` with the project, editable; the operator and trainer
images never copy `hack/`), used by tests, benchmarks and the `hack/` entry points. See docs/testcluster.md.
"""
