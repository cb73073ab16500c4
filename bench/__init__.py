"""Benchmarks: ratios measured side by side in one run, never timed unit tests."""
