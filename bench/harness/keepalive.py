"""Keep-alive HTTP/1.1 connections on raw asyncio sockets, for open-loop load clients.

A client that opened a connection per request would measure its own TCP handshakes; these are
reused once a response has been read to its end, as a browser or an SDK reuses them. The
response body comes back as lines, so a streamed (SSE) body is read as it arrives.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from bench.harness.stack import HOST


class Connections:
    """Keep-alive HTTP/1.1 connections, reused once a response has been read to its end."""

    def __init__(self, port: int):
        self.port = port
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.opened = 0

    async def take(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self._idle:
            reader, writer = self._idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer
        self.opened += 1
        return await asyncio.open_connection(HOST, self.port)

    def give_back(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self._idle.append(conn)

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()


async def exchange(
    conns: Connections, method: str, path: str, body: dict[str, Any] | None
) -> tuple[int, Any]:
    """Send a request; returns (status, an async iterator of body lines)."""
    reader, writer = await conns.take()
    payload = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
    writer.write(head.encode() + b"\r\n" + payload)
    status_line = await reader.readline()
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    chunked = headers.get("transfer-encoding", "").lower() == "chunked"
    keep = headers.get("connection", "").lower() != "close"

    async def lines() -> Any:
        buffer = b""
        if chunked:
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await reader.readline()
                    break
                buffer += await reader.readexactly(size)
                await reader.readexactly(2)
                *complete, buffer = buffer.split(b"\n")
                for item in complete:
                    yield item.decode()
        else:
            buffer = await reader.readexactly(int(headers.get("content-length", 0)))
            for item in buffer.split(b"\n"):
                yield item.decode()
            buffer = b""
        if buffer:
            yield buffer.decode()
        if keep:
            conns.give_back((reader, writer))
        else:
            writer.close()

    return status, lines()
