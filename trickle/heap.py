"""The start-up heap out of the garbage collector's way.

A process of this stack starts with a large heap of long-lived objects (Celery, kombu, Flask,
pydantic models, the tokenizer), and every full (generation 2) collection walked all of it:
42-64 ms with the GIL held, in the web and in the worker process, a few times a minute under
load. That is a stall of every stream the process serves and of the consumer taking a burst.
``gc.freeze()`` moves what exists once start-up is done into a permanent generation the
collector skips (CPython's documented use: after start-up, before serving); what is allocated
while serving is collected as before.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect once, then freeze what is left: call when start-up is done."""
    gc.collect()
    gc.freeze()
