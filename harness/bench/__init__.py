"""Benchmarks run by `make bench*`; each prints ratios measured side by side in one run."""
