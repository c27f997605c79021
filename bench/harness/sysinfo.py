"""What the numbers were measured on: CPUs, memory, Python, CTranslate2, the checkout."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from trickle.config.settings import PROJECT_ROOT


def machine_info() -> dict[str, Any]:
    import ctranslate2

    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_total_gib": _mem_total_gib(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "ctranslate2": ctranslate2.__version__,
        "cuda_devices": ctranslate2.get_cuda_device_count(),
        "load_average_at_start": list(os.getloadavg()),
        "git": _git_state(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _git_state() -> dict[str, Any]:
    """The commit and which tracked files differ from it (others may edit while we measure)."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip()

    try:
        return {
            "commit": git("rev-parse", "--short", "HEAD"),
            "modified": [line[3:] for line in git("status", "--porcelain").splitlines()],
        }
    except (OSError, subprocess.SubprocessError):
        return {}
