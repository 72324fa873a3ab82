"""memfit: fit GPU training jobs in memory at the lowest cost."""
