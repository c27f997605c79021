"""Per-key fairness where a worker claims jobs, in one place: each key's token share
(``vtc``, ``token_shares``), its ``max_running_jobs`` cap (``key_caps``) and how a key over
either is held back (``key_holds``). The dispatcher (worker/dispatch.py) asks them; the
engine's side, the reserve lane, is worker/engine/fair_share.py.
"""
