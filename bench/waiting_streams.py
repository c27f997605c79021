"""What streams that wait in the queue cost the web process and Redis, per second.

An overloaded stack (issue 53's 1.0x on the demo: 10 s and more of queue) holds hundreds of
streamed requests whose jobs wait; each reader hears where its job stands every second. This
starts ``make up``'s stack as ``bench.outside`` does, stops the worker and its engine processes
(SIGSTOP) so every job stays queued, opens ``--streams`` streamed ``/v1/completions`` over one
keep-alive ``httpx`` client, and reads the web's and Redis's CPU over ``--seconds`` while they
all wait. Nothing else runs: the figures are the waiting itself.

    .venv/bin/python -m bench.waiting_streams [--streams 300] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

from bench.harness import models
from bench.harness.log import progress
from bench.harness.stack import cpu_of, up_roles
from bench.outside import PROMPT, SERVED_NAME, KeptConnections, start_stack
from ops.redis_server import free_port


async def hold_streams(port: int, count: int, opened: list[int], stop: threading.Event) -> None:
    """Open ``count`` streams and keep reading them until ``stop``; ``opened`` gets each one's
    status as its headers come (a waiting reader's first refresh sends them)."""
    body = {"model": SERVED_NAME, "prompt": PROMPT, "max_tokens": 16, "stream": True}
    async with KeptConnections(port) as client:

        async def one() -> None:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                opened.append(response.status_code)
                async for _line in response.aiter_lines():
                    pass

        tasks = [asyncio.create_task(one()) for _ in range(count)]
        while not stop.is_set():
            await asyncio.sleep(0.2)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args(argv)
    path = models.prepare("demo").path
    with tempfile.TemporaryDirectory(prefix="trickle-waiting-") as work_dir:
        work, port = Path(work_dir), free_port()
        stack = start_stack(path, work, port)
        stopped: list[int] = []
        try:
            roles = up_roles(stack.pid)
            stopped = roles["worker"] + roles["engine"]
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)  # every job stays queued
            opened: list[int] = []
            stop = threading.Event()
            client = threading.Thread(
                target=lambda: asyncio.run(hold_streams(port, args.streams, opened, stop))
            )
            client.start()
            deadline = time.monotonic() + 60
            while len(opened) < args.streams and time.monotonic() < deadline:
                time.sleep(0.2)
            progress(f"{len(opened)} streams waiting (statuses {sorted(set(opened))})")
            time.sleep(3)  # past their first refresh
            groups = {role: roles[role] for role in ("web", "redis")}
            before, started = cpu_of(groups), time.monotonic()
            time.sleep(args.seconds)
            after, span = cpu_of(groups), time.monotonic() - started
            stop.set()
            client.join()
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            stack.terminate()
            stack.wait(30)
    shares = ", ".join(
        f"{role} {100 * (after[role] - before[role]) / span:.1f} % of a core" for role in groups
    )
    print(f"{len(opened)} waiting streams over {span:.1f} s: {shares}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
