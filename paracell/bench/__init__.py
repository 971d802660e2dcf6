"""Benchmarks: JSON results, ratios against same-run baselines."""
