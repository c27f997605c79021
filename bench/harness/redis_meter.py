"""A byte-counting TCP proxy in front of Redis: egress per command, for the benchmarks.

Redis reports its total output (``INFO stats``), not who caused it. Every process of a
benchmark stack connects through this proxy instead, which forwards bytes both ways unchanged
and parses the RESP replies to charge each one's size to the command that asked for it (replies
come back in request order), or, on a subscribed connection, to the push's kind ("pubsub
message", "pubsub subscribe"...). Runs in its own thread; costs latency, never changes traffic.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, deque
from collections.abc import Callable

from ops.redis_server import free_port

PUBSUB_COMMANDS = {b"SUBSCRIBE", b"SSUBSCRIBE", b"PSUBSCRIBE"}


def value_end(buf: bytes | bytearray, pos: int) -> int | None:
    """Where the RESP value starting at ``pos`` ends (exclusive), None if it is incomplete."""
    line_end = buf.find(b"\r\n", pos)
    if line_end < 0:
        return None
    kind, header = buf[pos : pos + 1], buf[pos + 1 : line_end]
    after = line_end + 2
    if kind in (b"+", b"-", b":", b"_", b",", b"#"):
        return after
    if kind in (b"$", b"=", b"!"):
        size = int(header)
        if size < 0:
            return after
        end = after + size + 2
        return end if len(buf) >= end else None
    if kind in (b"*", b">", b"~", b"%"):
        count = int(header) * (2 if kind == b"%" else 1)
        for _ in range(max(count, 0)):
            nested = value_end(buf, after)
            if nested is None:
                return None
            after = nested
        return after
    raise ValueError(f"not RESP: {bytes(buf[pos : pos + 20])!r}")


def first_word(buf: bytes | bytearray, start: int, end: int) -> bytes:
    """The command name of a request (an array of bulk strings), or a push's kind."""
    if buf[start : start + 1] not in (b"*", b">"):
        return bytes(buf[start : start + 1])
    line = buf.find(b"\r\n", start) + 2
    if buf[line : line + 1] != b"$":
        return b"?"
    size_end = buf.find(b"\r\n", line)
    size = int(buf[line + 1 : size_end])
    return bytes(buf[size_end + 2 : size_end + 2 + size]).upper()


class RedisMeter:
    """Listens on ``port`` and forwards to Redis on ``target_port``; ``egress`` counts bytes."""

    def __init__(self, target_port: int, host: str = "127.0.0.1"):
        self.host = host
        self.target_port = target_port
        self.port = free_port()
        self.egress: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="redis-meter", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.egress)

    def total(self) -> int:
        with self._lock:
            return sum(self.egress.values())

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, self.host, self.port)
        )
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()

    async def _connection(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        server_r, server_w = await asyncio.open_connection(self.host, self.target_port)
        asked: deque[str] = deque()
        subscribed = [False]  # once a pub/sub command went out, every reply is a push

        def request(buf: bytearray, start: int, end: int) -> None:
            name = first_word(buf, start, end)
            subscribed[0] = subscribed[0] or name in PUBSUB_COMMANDS
            asked.append(name.decode(errors="replace"))

        def reply(buf: bytearray, start: int, end: int) -> None:
            if subscribed[0]:
                kind = "pubsub " + first_word(buf, start, end).decode(errors="replace").lower()
            else:
                kind = asked.popleft() if asked else "?"
            with self._lock:
                self.egress[kind] += end - start

        await asyncio.gather(
            _pump(client_r, server_w, request), _pump(server_r, client_w, reply),
            return_exceptions=True,
        )  # fmt: skip
        client_w.close()
        server_w.close()


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    on_value: Callable[[bytearray, int, int], None],
) -> None:
    """Forward bytes unchanged, calling ``on_value`` for each whole RESP value that passed."""
    buf = bytearray()
    while data := await reader.read(65536):
        writer.write(data)
        buf += data
        pos = 0
        while (end := value_end(buf, pos)) is not None:
            on_value(buf, pos, end)
            pos = end
        del buf[:pos]
        await writer.drain()
    writer.close()
