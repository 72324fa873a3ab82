"""memfit trainer runtime: runs inside the profiling and training pods."""
