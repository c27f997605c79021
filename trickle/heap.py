"""The start-up heap out of the garbage collector's way.

A process of this stack starts with a large heap of long-lived objects (Celery, kombu, Flask,
pydantic models, the tokenizer), and every full (generation 2) collection walked all of it:
42-64 ms with the GIL held, in the web and in the worker process, a few times a minute under
load. That is a stall of every stream the process serves and of the consumer taking a burst.
``gc.freeze()`` moves what exists once start-up is done into a permanent generation the
collector skips (CPython's documented use: after start-up, before serving); what is allocated
while serving is collected as before.

And the free heap back to the OS once a process idles: after a flood, glibc keeps the pages it
freed in its arenas (a fragmented heap's holes are never the top it trims by itself), so a
process that served one burst of big answers stayed at that size for hours. ``IdleTrim`` calls
``malloc_trim`` once per idle spell: the engine after its batches (worker/engine/malloc.py),
the web process after its requests (web/gunicorn_conf.py).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


def freeze_startup_heap() -> None:
    """Collect once, then freeze what is left: call when start-up is done."""
    gc.collect()
    gc.freeze()


def _find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` from the symbols the process has loaded already (no
    ``ctypes.util.find_library``: it runs ``ldconfig`` in a subprocess, which gevent's patched
    ``subprocess`` refuses on a thread of its pool); None where the C library is not glibc."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    return malloc_trim


_MALLOC_TRIM = _find_malloc_trim()  # resolved once, at import, on the importing thread


def trim_freed_memory() -> bool:
    """Give the free pages of every malloc arena back to the OS (glibc's ``malloc_trim``);
    False where there was nothing to give back or the C library is not glibc."""
    return _MALLOC_TRIM is not None and bool(_MALLOC_TRIM(0))


class IdleTrim:
    """Trims the heap once per idle spell: after ``after`` seconds with no batch running.

    Lanes call ``begin`` and ``end`` around each batch; a thread of its own waits for the
    spell, so no lane ever waits on a trim to start its batch (a batch that starts meanwhile
    only waits for the arena locks the trim holds, a few milliseconds)."""

    def __init__(self, after: float, trim: Callable[[], object] = trim_freed_memory):
        self._after = after
        self._trim = trim
        self._running = 0
        self._idle_since = time.monotonic()
        self._trimmed = False  # the warm-up's buffers are the first thing to give back
        self._cond = threading.Condition()
        self.trims = 0
        threading.Thread(target=self._wait_for_idle, name="trickle-trim", daemon=True).start()

    def note(self) -> None:
        """Activity that holds nothing open (a request begun): the idle spell starts again."""
        self.begin()
        self.end()

    def begin(self) -> None:
        with self._cond:
            self._running += 1
            self._trimmed = False

    def end(self) -> None:
        with self._cond:
            self._running -= 1
            if self._running == 0:
                self._idle_since = time.monotonic()
                self._cond.notify()

    def _wait_for_idle(self) -> None:
        while True:
            with self._cond:
                while self._running or self._trimmed:
                    self._cond.wait()
                left = self._idle_since + self._after - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue  # a batch may have begun (and ended) meanwhile: look again
                self._trimmed = True
            try:
                self._trim()
            except Exception:  # one failed trim must not end the thread (and every later trim)
                log.exception("malloc_trim failed; the next idle spell tries again")
            self.trims += 1
