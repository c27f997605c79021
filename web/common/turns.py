"""Long loops of one request that let the web process's other requests run between steps.

The web tier serves every request of a process from one gevent event loop: a loop over a
10,000-line batch (parsing, tokenizing, recording) that never yields holds every other request
of the process, health checks included, for as long as it runs. ``in_turns`` gives the loop a
turn every ``TURN_ITEMS`` items, so no other request waits for more than one stretch of them
(about 5 ms of work on the demo model's lines). Outside gevent ``time.sleep(0)`` is only a
yield of the GIL.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")

TURN_ITEMS = 50


def in_turns(items: Iterable[T], every: int = TURN_ITEMS) -> Iterator[T]:
    """``items``, with a turn of the event loop after every ``every`` of them."""
    for count, item in enumerate(items, start=1):
        yield item
        if count % every == 0:
            time.sleep(0)


def in_groups(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in slices of ``size`` (one Redis transaction each, say), with a turn of the
    event loop between slices: packing and answering thousands of commands in one
    transaction is a stretch of CPU no turn can split."""
    for start in range(0, len(items), size):
        if start:
            time.sleep(0)
        yield items[start : start + size]


_pausing = 0  # requests inside ``collection_paused`` now (greenlets of one process)


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No automatic garbage collection while a request makes thousands of records.

    Such a request allocates about a million objects, nearly all freed by reference counting
    when it ends; meanwhile they trip full (generation 2) collections, each a pause of 50-80 ms
    for every request of the process that no ``in_turns`` can split. Paused, none starts; the
    objects that outlive the request are collected later as usual. Nested and concurrent uses
    share the pause: collection resumes when the last one leaves.
    """
    global _pausing
    if _pausing == 0 and not gc.isenabled():
        yield  # paused by someone else (a test, an embedding process): theirs to resume
        return
    _pausing += 1
    gc.disable()
    try:
        yield
    finally:
        _pausing -= 1
        if _pausing == 0:
            gc.enable()
