"""The engine's stop flags: one byte per batch slot, shared between the worker and its engine.

A POSIX shared-memory segment outlives the processes that map it until its name is unlinked.
So each engine start makes its own segment, named for the worker process that made it
(``trickle_<pid>_<random>``), and unlinks the name as soon as the engine process has attached:
both keep their mappings, and nothing is left in ``/dev/shm`` whatever is killed afterwards. A
worker killed in the seconds between creating a segment and its engine's start leaves that
name behind; the next worker to start an engine on the machine unlinks every segment whose
creator is no longer alive.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path

SHM_PREFIX = "trickle_"
SHM_DIR = Path("/dev/shm")


def create_flags(size: int) -> SharedMemory:
    """A fresh segment for one engine start (after sweeping dead workers' leftovers)."""
    unlink_dead_segments()
    name = f"{SHM_PREFIX}{os.getpid()}_{secrets.token_hex(4)}"
    return SharedMemory(name=name, create=True, size=size)


def attach_flags(name: str) -> SharedMemory:
    """The engine process's side: map the worker's segment, leaving its name to the worker.
    (Attaching registers the name with the resource tracker a spawned process shares with its
    parent, where the worker registered it already; the worker's unlink takes it off.)"""
    return SharedMemory(name=name)


def unlink_dead_segments(root: Path = SHM_DIR) -> list[str]:
    """Unlink the segments of worker processes that are gone; returns their names."""
    removed = []
    for entry in root.glob(f"{SHM_PREFIX}*"):
        pid = entry.name[len(SHM_PREFIX) :].partition("_")[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                entry.unlink()
                removed.append(entry.name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True
