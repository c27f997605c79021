"""Fan-out readers: thousands of SSE streams in one asyncio process, as light as possible.

Run by ``bench.fanout`` as ``python -m bench.harness.fanout_client``, in its own process so that
its CPU and file descriptors are not the server's. Each reader is a raw ``asyncio.Protocol`` that
counts ``event: token`` lines in the bytes it receives (no JSON, no dechunking: every SSE event is
one HTTP chunk, so a pattern is never cut by chunk framing, and a 12-byte tail covers reads that
cut it). Commands arrive one per line on stdin (``snapshot``, ``stop``), answers are JSON lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from typing import Any

TOKEN = b"event: token\n"
DONE = b"event: done\n"
TAIL = len(TOKEN) - 1


class Reader(asyncio.Protocol):
    def __init__(self, job: str, request: bytes, connected: asyncio.Future[None]):
        self.job = job
        self._request = request
        self._connected = connected
        self._head = b""
        self._tail = b""
        self.status = 0
        self.tokens = 0
        self.done = False
        self.closed_early = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        if not self.status:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            self.status = int(self._head.split(b" ", 2)[1])
            data = self._head[end + 4 :]
            self._head = b""
            if not self._connected.done():
                if self.status == 200:
                    self._connected.set_result(None)
                else:
                    self._connected.set_exception(RuntimeError(f"HTTP {self.status}"))
        buffer = self._tail + data
        self.tokens += buffer.count(TOKEN)
        if not self.done and DONE in buffer:
            self.done = True
        self._tail = buffer[-TAIL:]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done:
            self.closed_early = True
        if not self._connected.done():
            self._connected.set_exception(ConnectionError(str(exc or "closed")))


class Readers:
    def __init__(self, host: str, port: int, jobs: list[str]):
        self.host = host
        self.port = port
        self.jobs = jobs
        self.readers: list[Reader] = []
        self.errors: dict[str, int] = {}

    async def open(self, count: int, concurrency: int, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        gate = asyncio.Semaphore(concurrency)

        async def open_one(index: int) -> None:
            job = self.jobs[index % len(self.jobs)]
            request = (
                f"GET /v1/jobs/{job}/events HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                "Accept: text/event-stream\r\nUser-Agent: trickle-bench-fanout\r\n\r\n"
            ).encode()
            async with gate:
                connected: asyncio.Future[None] = loop.create_future()
                try:
                    _, reader = await asyncio.wait_for(
                        loop.create_connection(
                            lambda: Reader(job, request, connected), self.host, self.port
                        ),
                        timeout,
                    )
                    await asyncio.wait_for(connected, timeout)
                    self.readers.append(reader)
                except (OSError, RuntimeError, TimeoutError) as exc:
                    key = f"{type(exc).__name__}: {exc}"[:120]
                    self.errors[key] = self.errors.get(key, 0) + 1

        await asyncio.gather(*(open_one(i) for i in range(count)))

    def snapshot(self) -> dict[str, Any]:
        per_job: dict[str, int] = {job: 0 for job in self.jobs}
        counts = []
        for reader in self.readers:
            per_job[reader.job] += reader.tokens
            counts.append(reader.tokens)
        return {
            "event": "snapshot",
            "time": time.time(),
            "tokens": sum(counts),
            "per_job_tokens": per_job,
            "min_reader_tokens": min(counts) if counts else 0,
            "max_reader_tokens": max(counts) if counts else 0,
            "done": sum(reader.done for reader in self.readers),
            "closed_early": sum(reader.closed_early for reader in self.readers),
            "readers": len(self.readers),
        }

    def close(self) -> None:
        for reader in self.readers:
            if reader.transport is not None:
                reader.transport.abort()


def say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def main_async(args: argparse.Namespace) -> None:
    readers = Readers(args.host, args.port, args.jobs.split(","))
    start = time.perf_counter()
    await readers.open(args.readers, args.concurrency, args.connect_timeout)
    say(
        {
            "event": "connected",
            "connected": len(readers.readers),
            "failed": args.readers - len(readers.readers),
            "errors": readers.errors,
            "seconds": time.perf_counter() - start,
        }
    )
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    try:
        while True:
            line = (await stdin.readline()).strip()
            if line == b"snapshot":
                say(readers.snapshot())
            elif line in (b"stop", b""):
                break
    finally:
        final = readers.snapshot()
        readers.close()
        await asyncio.sleep(0)
        say({**final, "event": "stopped"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--jobs", required=True, help="comma-separated job ids")
    parser.add_argument("--readers", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--connect-timeout", type=float, default=60.0)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = args.readers + 256
    if soft < wanted:
        limit = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
