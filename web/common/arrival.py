"""When a request reached this web process: the start of its jobs' ``admit`` hop."""

from __future__ import annotations

import time

from flask import Flask, g, has_request_context

_ARRIVED = "trickle_arrived_at"


def install_arrival(app: Flask) -> None:
    """Note the arrival first, before any other hook (CORS, keys) spends time on it."""
    app.before_request_funcs.setdefault(None, []).insert(0, _note_arrival)


def _note_arrival() -> None:
    setattr(g, _ARRIVED, time.time())


def arrival_time() -> float:
    """This request's arrival (unix seconds); 0 outside a request (a batch's jobs, made by
    its sweeper: no person waits on their first token)."""
    if not has_request_context():
        return 0.0
    arrived: float = getattr(g, _ARRIVED, 0.0)
    return arrived
