"""Benchmarks: ours next to the physical limit, direct, and LiteLLM, measured as ratios in one run."""
