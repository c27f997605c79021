"""A JSON body written in bounded pieces: a big answer never sits whole in the web process.

One chat with ``n=8``, ``top_logprobs`` 20 and 2,048 tokens each is a 22 MiB body of about
330,000 objects; built as one dict and one string it held every stream of the process for about
2 s and grew the process by ~170 MiB. Here the object's big arrays are ``Lazy`` (their entries
made as they are written), and ``json_pieces`` writes the object a piece of about
``PIECE_CHARS`` at a time, giving the event loop a turn between pieces.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from typing import Any

PIECE_CHARS = 65_536


class Lazy:
    """A JSON array whose entries are made as they are written (once)."""

    def __init__(self, entries: Iterable[Any]):
        self.entries = entries


def json_pieces(value: Any) -> Iterator[str]:
    """``value`` as compact JSON text, in pieces of about ``PIECE_CHARS`` characters."""
    buffer: list[str] = []
    size = 0
    for part in _parts(value):
        buffer.append(part)
        size += len(part)
        if size >= PIECE_CHARS:
            yield "".join(buffer)
            buffer, size = [], 0
            time.sleep(0)  # under gevent: the process's other requests run between pieces
    if buffer:
        yield "".join(buffer)


def _parts(value: Any) -> Iterator[str]:
    """Objects and lists are walked down to the ``Lazy`` arrays; a ``Lazy`` array's entries
    (one token's logprobs: the pieces' grain) and every other value are dumped whole."""
    if isinstance(value, dict):
        yield "{"
        for index, (key, item) in enumerate(value.items()):
            yield ("," if index else "") + _dump(key) + ":"
            yield from _parts(item)
        yield "}"
    elif isinstance(value, list):
        yield "["
        for index, item in enumerate(value):
            yield "," if index else ""
            yield from _parts(item)
        yield "]"
    elif isinstance(value, Lazy):
        yield "["
        for index, item in enumerate(value.entries):
            yield ("," if index else "") + _dump(item)
        yield "]"
    else:
        yield _dump(value)


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
