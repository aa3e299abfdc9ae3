"""Benchmarks: `python -m bench.harness --help`. Results, one JSON file per run, live in bench/results/."""
