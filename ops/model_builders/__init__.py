"""Offline builders of the project's own small models (the demo bigram model and random
Llama-style models): used by ``trickle demo-model``, the tests and the benchmarks, never by a
serving process, so they live outside the worker package."""
