"""A job's token stream over WebSocket, read by a minimal asyncio client (RFC 6455).

The bench's other clients are raw asyncio HTTP; this one speaks just enough WebSocket to read a
job's frames over its own connection (server frames are never masked; the client sends none but
its handshake), so the client's CPU stays comparable to the SSE reader's.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from typing import Any

from bench.harness.stack import HOST

OPCODE_TEXT, OPCODE_CLOSE = 0x1, 0x8


async def read_frames(port: int, path: str) -> Any:
    """Yield each text frame's payload until the server closes."""
    reader, writer = await asyncio.open_connection(HOST, port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    status = (await reader.readline()).split()
    if len(status) < 2 or status[1] != b"101":
        writer.close()
        raise ConnectionError(f"WebSocket upgrade refused: {b' '.join(status).decode()}")
    while await reader.readline() not in (b"\r\n", b""):
        pass
    try:
        while True:
            head = await reader.readexactly(2)
            opcode, size = head[0] & 0x0F, head[1] & 0x7F
            if size == 126:
                size = int.from_bytes(await reader.readexactly(2), "big")
            elif size == 127:
                size = int.from_bytes(await reader.readexactly(8), "big")
            payload = await reader.readexactly(size)
            if opcode == OPCODE_CLOSE:
                return
            if opcode == OPCODE_TEXT:
                yield payload.decode()
    except asyncio.IncompleteReadError:
        return
    finally:
        writer.close()


async def follow_job_ws(port: int, job_id: str) -> tuple[list[float], int, str]:
    """Arrival times of frames with text, tokens received, and the final status."""
    arrivals: list[float] = []
    tokens, status = 0, "unknown"
    async for frame in read_frames(port, f"/v1/jobs/{job_id}/ws"):
        message = json.loads(frame)
        if message["event"] == "token":
            tokens += message.get("count", 1)
            if message["text"]:
                arrivals.append(time.perf_counter())
        elif message["event"] == "done":
            status = message["job"]["status"]
    return arrivals, tokens, status
