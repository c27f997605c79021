"""The launcher starts the batch consumer at ``[supervisor] batch_niceness`` and every other
Procfile process as itself (ops/priority.py): the batch tier waits for a core behind the web
tier. Real child processes, started by exec as ``trickle up`` starts non-Celery lines."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.launcher import ProcfileLauncher
from ops.stack import spawn, stop
from ops.supervisor import RespawnPolicy, Supervisor
from trickle.config.sections import SupervisorSettings


@pytest.fixture
def supervisor() -> Iterator[Supervisor]:
    policy = RespawnPolicy.from_settings(SupervisorSettings(stop_timeout_seconds=2.0))
    supervisor = Supervisor(policy, out=io.StringIO())
    yield supervisor
    supervisor.shutdown()


def autogroup_nice(pid: int) -> int | None:
    """The nice value of the process's autogroup (``/autogroup-N nice M``), if the kernel has
    autogroups. A process in the kernel's default group (one whose session never began under
    autogroup, as PID 1's and a CI runner's children's) reads an empty file: its group is
    the root group, weighed as nice 0."""
    try:
        text = Path(f"/proc/{pid}/autogroup").read_text()
    except OSError:
        return None
    return int(text.split()[-1]) if text.strip() else 0


def test_the_batch_line_runs_at_its_niceness_and_the_others_as_the_launcher(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    procfile = tmp_path / "Procfile"
    procfile.write_text("web: sleep 60\nbatch: sleep 60\nworker: sleep 60\n")
    launcher = ProcfileLauncher(
        procfile, dict(os.environ), supervisor, priorities=SupervisorSettings(batch_niceness=7)
    )
    pids = {kind: launcher.spawn(kind).process.pid for kind in ("web", "batch", "worker")}  # type: ignore[union-attr]
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, pids["batch"]) == max(mine, 7)
    assert os.getpriority(os.PRIO_PROCESS, pids["web"]) == mine
    assert os.getpriority(os.PRIO_PROCESS, pids["worker"]) == mine
    # Each child leads a session of its own, so a group of its own, which starts at nice 0:
    # where the kernel groups sessions, the batch's group is lowered too (else its nice value
    # would weigh only inside its own group) and the others' are left as they begin.
    if autogroup_nice(pids["batch"]) is not None:
        assert autogroup_nice(pids["batch"]) == 7
        assert autogroup_nice(pids["web"]) == 0
        assert autogroup_nice(pids["worker"]) == 0


def test_the_default_lowers_the_batch_consumer_and_zero_leaves_it(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    procfile = tmp_path / "Procfile"
    procfile.write_text("batch: sleep 60\n")
    assert SupervisorSettings().batch_niceness == 10
    launcher = ProcfileLauncher(
        procfile, dict(os.environ), supervisor, priorities=SupervisorSettings(batch_niceness=0)
    )
    pid = launcher.spawn("batch").process.pid  # type: ignore[union-attr]
    assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0)


def test_the_stack_spawns_at_a_nice_value_and_as_itself_without(tmp_path: Path) -> None:
    """``ops.stack.spawn``, as the tests and benchmarks start the batch consumer."""
    log = tmp_path / "sleep.log"
    lowered = spawn(["sleep", "60"], dict(os.environ), log, new_session=True, nice=6)
    plain = spawn(["sleep", "60"], dict(os.environ), log)
    try:
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, lowered.pid) == max(mine, 6)
        assert os.getpriority(os.PRIO_PROCESS, plain.pid) == mine
    finally:
        stop(lowered, 2.0)
        stop(plain, 2.0)
