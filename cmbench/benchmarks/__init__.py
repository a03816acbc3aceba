"""Benchmarks behind results/: speed and memory of the methods, the tiny model's memory check."""
