"""Trickle benchmarks: the engine's own limit and the served stack, side by side.

Run ``python -m bench.run --help``. Results go to ``bench/results/`` (gitignored).
"""
