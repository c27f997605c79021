"""Trickle worker: the job contract (jobs, events, keys, store, config) and the generation engine.

The contract modules import nothing else from ``worker`` that pulls in CTranslate2, so the web tier
can use them and stay light.
"""
