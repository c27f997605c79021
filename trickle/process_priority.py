"""A process's share of the CPU against the others on the host: its nice value, and its
autogroup's when it leads its own session.

With the kernel's autogroup on (``/proc/sys/kernel/sched_autogroup_enabled``, for processes
in the root CPU cgroup), each session is a scheduling group of its own, weighed against the
others by the group's nice value, not its processes'. A process's own nice value then only
orders it against its session's other processes: an engine process niced inside its worker's
session still takes a core from the web tier's session as if it were not niced at all. So a
process that must yield to other sessions leads a session of its own and lowers its group.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

AUTOGROUP = Path("/proc/self/autogroup")


def lower_priority(nice: int) -> None:
    """Run this process at ``nice``, its session's autogroup too when it leads that session;
    0 changes nothing, nor does a process already nicer (raising a process's priority back
    would need privileges). A process that shares its parent's session leaves the group
    alone: lowering it would lower the parent's."""
    if nice <= 0:
        return
    if nice > os.getpriority(os.PRIO_PROCESS, 0):
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    if os.getsid(0) == os.getpid():
        with contextlib.suppress(OSError):  # no autogroup in this kernel: the nice value is all
            AUTOGROUP.write_text(f"{nice}\n")


def yield_cores(by: int) -> None:
    """Yield the CPU to every other session's processes: run ``by`` nicer than now (at most
    19), leading a session of its own first (a process group leader keeps its own), so that
    the nice value weighs against them and not only against its siblings.

    A new session leaves its parent's process group: a signal to that group no longer reaches
    this process, so it must end with its parent by other means (the engine's parent watch)."""
    if by <= 0:
        return
    with contextlib.suppress(OSError):  # already a group leader: keeps its session
        os.setsid()
    lower_priority(min(os.getpriority(os.PRIO_PROCESS, 0) + by, 19))
