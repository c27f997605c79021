"""The batch tier below the request tier on the CPU: a Procfile process's nice value.

On a busy host the web tier's slow answers are time spent runnable but waiting for a core
(its run delay), while the batch consumer reads a large input into jobs or settles one into
files (docs/performance.md). So whatever starts the Procfile's processes (``trickle up``, the
tests' and benchmarks' ``ops.stack``) starts the batch consumer at ``[supervisor]
batch_niceness``, as a serving system keeps its background tier behind its request tier.

With the kernel's autogroup on (``/proc/sys/kernel/sched_autogroup_enabled``, for processes
in the root CPU cgroup), each session is a scheduling group of its own, weighed against the
others by the group's nice value, not its processes': a process started in a session of its
own (every ``trickle up`` child) lowers its session's group as well. A process that shares
its parent's session leaves the group alone: lowering it would lower the parent's.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from trickle.config.sections import SupervisorSettings

AUTOGROUP = Path("/proc/self/autogroup")


def niceness(kind: str, settings: SupervisorSettings) -> int:
    """The nice value a Procfile process type runs at."""
    return settings.batch_niceness if kind == "batch" else 0


def lower_priority(nice: int) -> None:
    """Run this process (a child before it execs) at ``nice``, its session's autogroup too
    when it leads that session; 0 changes nothing, nor does a launcher already nicer (raising
    a process's priority back would need privileges)."""
    if nice <= 0:
        return
    if nice > os.getpriority(os.PRIO_PROCESS, 0):
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    if os.getsid(0) == os.getpid():
        with contextlib.suppress(OSError):  # no autogroup in this kernel: the nice value is all
            AUTOGROUP.write_text(f"{nice}\n")
