"""memfit: fit GPU training jobs in memory at the lowest cost."""

__version__ = "0.1.0"
