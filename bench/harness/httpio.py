"""A deliberately small HTTP/1.1 client on raw asyncio sockets, plus a blocking probe.

Light enough to hold thousands of SSE streams in one process: no HTTP library, no per-event
allocations beyond what the measurement needs. ``SseStream`` parses a response fully (status,
chunked framing, SSE events, with an arrival time per event); the fan-out readers use their own
even lighter counter (``bench.harness.fanout_client``).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class HttpResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _request_bytes(method: str, host: str, port: int, path: str, body: bytes | None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "User-Agent: trickle-bench"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    if method == "GET" and path.endswith("/events"):
        lines.append("Accept: text/event-stream")
    else:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


async def request(
    host: str, port: int, method: str, path: str, payload: Any = None, timeout: float = 30
) -> HttpResponse:
    """One request on its own connection (``Connection: close``), read to the end."""
    body = None if payload is None else json.dumps(payload).encode()

    async def go() -> HttpResponse:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(_request_bytes(method, host, port, path, body))
            raw = await reader.read(-1)
        finally:
            writer.close()
        head, _, rest = raw.partition(b"\r\n\r\n")
        status, headers = _parse_head(head)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            rest = _dechunk_all(rest)
        return HttpResponse(status, headers, rest)

    return await asyncio.wait_for(go(), timeout)


def _dechunk_all(data: bytes) -> bytes:
    out = bytearray()
    decoder = Dechunker()
    decoder.feed(data, out)
    return bytes(out)


class Dechunker:
    """Incremental ``Transfer-Encoding: chunked`` decoder."""

    def __init__(self) -> None:
        self._buffer = b""
        # -1: expecting a size line; > 0: data bytes left in this chunk; 0: expecting its CRLF.
        self._remaining = -1
        self.finished = False

    def feed(self, data: bytes, out: bytearray) -> None:
        self._buffer += data
        while not self.finished:
            if self._remaining < 0:
                end = self._buffer.find(b"\r\n")
                if end < 0:
                    return
                size = int(self._buffer[:end].split(b";")[0], 16)
                self._buffer = self._buffer[end + 2 :]
                if size == 0:
                    self.finished = True
                    return
                self._remaining = size
            if self._remaining > 0:
                take = min(self._remaining, len(self._buffer))
                if take == 0:
                    return
                out += self._buffer[:take]
                self._buffer = self._buffer[take:]
                self._remaining -= take
                if self._remaining > 0:
                    return
            if len(self._buffer) < 2:
                return
            self._buffer = self._buffer[2:]
            self._remaining = -1


@dataclass
class SseEvent:
    event: str
    data: str
    event_id: str | None
    arrived: float  # time.perf_counter() when the bytes carrying it arrived


@dataclass
class SseResult:
    status: int = 0
    events: list[SseEvent] = field(default_factory=list)
    error: str | None = None
    closed_by_server: bool = False


def parse_sse_block(block: str, arrived: float) -> SseEvent | None:
    """The event of one SSE block (its lines up to a blank one); None for a block of comments
    or the ``retry:`` preamble."""
    event, data, event_id = "message", [], None
    for line in block.split("\n"):
        if line.startswith(":") or not line:
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            event_id = value
    if not data and event == "message":
        return None
    return SseEvent(event, "\n".join(data), event_id, arrived)


class SseStream(asyncio.Protocol):
    """One SSE response, parsed as it arrives; ``done`` resolves after ``event: done``."""

    def __init__(self, request_bytes: bytes, done: asyncio.Future[SseResult]):
        self._request = request_bytes
        self._done = done
        self._head = b""
        self._in_body = False
        self._chunked = False
        self._dechunker = Dechunker()
        self._text = b""
        self.result = SseResult()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self._in_body:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            status, headers = _parse_head(self._head[:end])
            self.result.status = status
            self._chunked = headers.get("transfer-encoding", "").lower() == "chunked"
            data = self._head[end + 4 :]
            self._in_body = True
        if self._chunked:
            body = bytearray()
            self._dechunker.feed(data, body)
            self._text += bytes(body)
        else:
            self._text += data
        self._parse(now)

    def _parse(self, now: float) -> None:
        while True:
            end = self._text.find(b"\n\n")
            if end < 0:
                return
            block = self._text[:end].decode("utf-8")
            self._text = self._text[end + 2 :]
            event = parse_sse_block(block, now)
            if event is None:
                continue
            self.result.events.append(event)
            if event.event == "done":
                self._finish()
                return

    def _finish(self, error: str | None = None) -> None:
        if error is not None and self.result.error is None:
            self.result.error = error
        if not self._done.done():
            self._done.set_result(self.result)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.result.closed_by_server = not self._done.done()
        if not self._done.done():
            self._finish(f"connection closed before done ({exc or 'EOF'})")


async def follow_sse(host: str, port: int, path: str, timeout: float) -> SseResult:
    """Read one SSE stream until its ``done`` event (or an error, or ``timeout``)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[SseResult] = loop.create_future()
    request_bytes = _request_bytes("GET", host, port, path, None)
    transport, protocol = await loop.create_connection(
        lambda: SseStream(request_bytes, done), host, port
    )
    try:
        return await asyncio.wait_for(asyncio.shield(done), timeout)
    except TimeoutError:
        protocol.result.error = f"timed out after {timeout}s"
        return protocol.result
    finally:
        transport.close()


def probe(host: str, port: int, path: str, timeout: float = 10.0) -> tuple[int, float]:
    """A blocking GET on a fresh connection: (status, seconds). Status 0 on failure."""
    start = time.perf_counter()
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status, time.perf_counter() - start
    except OSError:
        return 0, time.perf_counter() - start
    finally:
        connection.close()


def post_json(host: str, port: int, path: str, payload: Any, timeout: float = 30.0) -> Any:
    """A blocking POST with a JSON body; returns the decoded JSON answer."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        body = json.dumps(payload).encode()
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return json.loads(response.read() or b"null")
    finally:
        connection.close()
