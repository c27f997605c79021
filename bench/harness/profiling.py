"""py-spy recordings of the stack's web and worker processes while a benchmark phase runs.

py-spy is not a dependency (``pip install py-spy``); ``--profile-dir`` on a bench command asks
for it. Speedscope files, one per process, with ``--gil`` so waits on I/O are left out.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trickle.config.settings import PROJECT_ROOT


def start_profilers(groups: dict[str, list[int]], out: Path) -> list[subprocess.Popen[bytes]]:
    spy = shutil.which("py-spy") or str(Path(PROJECT_ROOT) / ".venv" / "bin" / "py-spy")
    out.mkdir(parents=True, exist_ok=True)
    started = []
    for role in ("web", "worker"):
        started.append(
            subprocess.Popen(
                [spy, "record", "--pid", str(groups[role][0]), "--rate", "500", "--nonblocking",
                 "--format", "speedscope", "--output", str(out / f"{role}.speedscope.json"),
                 "--threads", "--gil"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
    time.sleep(1.0)
    return started


def stop_profilers(profilers: list[subprocess.Popen[bytes]]) -> None:
    for profiler in profilers:
        profiler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        profiler.wait(timeout=60)


@contextmanager
def profiled(groups: dict[str, list[int]], out: Path | None) -> Iterator[None]:
    """Record the web and worker processes for the block's duration (nothing if ``out`` is None)."""
    profilers = [] if out is None else start_profilers(groups, out)
    try:
        yield
    finally:
        stop_profilers(profilers)
