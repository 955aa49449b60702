"""Benchmarks: ``python -m flashrt.bench kernels`` on a GPU; results land in bench/results/."""
