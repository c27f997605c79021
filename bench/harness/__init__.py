"""The benchmarks' shared harness: stack, models, clients, statistics, reports."""
