"""benchmarks/: every benchmark script runs in its quickest mode and prints its summary line, numbers sane."""
