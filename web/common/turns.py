"""Long loops of one request that let the web process's other requests run between steps.

The web tier serves every request of a process from one gevent event loop: a loop over a
10,000-line batch (parsing, tokenizing, recording) that never yields holds every other request
of the process, health checks included, for as long as it runs. ``in_turns`` gives the loop a
turn every ``TURN_ITEMS`` items, so no other request waits for more than one stretch of them
(about 5 ms of work on the demo model's lines). Outside gevent ``time.sleep(0)`` is only a
yield of the GIL.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

TURN_ITEMS = 50


def in_turns(items: Iterable[T], every: int = TURN_ITEMS) -> Iterator[T]:
    """``items``, with a turn of the event loop after every ``every`` of them."""
    for count, item in enumerate(items, start=1):
        yield item
        if count % every == 0:
            time.sleep(0)
