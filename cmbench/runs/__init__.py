"""Runs: the task loop (selection, seeds, shards, resume), the task evaluator and the records files."""
