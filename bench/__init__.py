"""Benchmarks: ours next to the physical limit, direct, and LiteLLM, as ratios from one run."""
