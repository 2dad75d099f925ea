"""Benchmarks: speed and memory targets, measured on generated data; results in results/*.json."""
