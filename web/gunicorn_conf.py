"""gunicorn settings for the web tier, taken from Trickle's own configuration.

gevent workers: every SSE stream is a greenlet, so thousands fit in one process (a thread per
stream, as with gthread, runs out long before).
"""

from __future__ import annotations

import os

from trickle.config.settings import load_settings
from trickle.heap import IdleTrim, freeze_startup_heap, trim_freed_memory
from web import gunicorn_errors

_settings = load_settings(environ=os.environ)
gunicorn_errors.install()  # its own 400/414/431 answers are JSON too

bind = f"{_settings.web.host}:{_settings.web.port}"
worker_class = "gevent"
workers = max(1, _settings.web.processes)
worker_connections = 10_000
graceful_timeout = 10
# A gevent worker saturated by thousands of streams can miss its heartbeat for a while; only
# kill it when it is really stuck.
timeout = 120
# An idle kept-alive connection is closed after this. Longer than the clients' own idle expiry
# (httpx and the openai client keep one 5 s), so a client never reuses one the server is closing:
# at 5 s, on a web process whose loop lagged by seconds at 1.0x, the server's timer fired on
# connections that already carried the next request, and reset them (the request lost, no job:
# docs/performance.md). nginx keeps 75 s; a gevent greenlet per idle connection is cheap.
keepalive = 75
# No access log by default (gunicorn's own default): formatting and writing a line per request
# is a real share of the web process's CPU on short jobs. Operators who want one pass
# gunicorn's flag, GUNICORN_CMD_ARGS="--access-logfile -" (it overrides this file).
accesslog = None


_idle_trim: IdleTrim | None = None


def post_worker_init(worker: object) -> None:
    """The app is loaded in this worker process: keep its start-up heap out of full
    collections, and hand a flood's free heap back once requests stop (trickle/heap.py)."""
    global _idle_trim
    freeze_startup_heap()
    if _settings.web.trim_after_idle_seconds > 0:
        _idle_trim = IdleTrim(_settings.web.trim_after_idle_seconds, trim=_trim_on_a_native_thread)


def _trim_on_a_native_thread() -> object:
    """``malloc_trim`` on gevent's pool of OS threads, the calling greenlet waiting for it:
    every greenlet shares one OS thread, so a trim made there held every stream until it
    returned (a page's 400-token stream reached it all at once); ctypes lets the GIL go for
    the call, so the loop runs on while another thread trims."""
    from gevent import get_hub

    return get_hub().threadpool.apply(trim_freed_memory)


def pre_request(worker: object, request: object) -> None:
    """Every request begun puts the next trim off (a stream that runs on holds nothing back:
    a trim gives only free pages)."""
    if _idle_trim is not None:
        _idle_trim.note()
