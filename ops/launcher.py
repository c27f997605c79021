"""`trickle up`: the embedded Redis plus every Procfile process, supervised (and autoscaled).

The Procfile stays the operators' interface: honcho, foreman or a Heroku-style platform run it
unchanged. `trickle up` reads it itself (with honcho's parser) so that it can restart what
dies instead of stopping everything (``ops.supervisor``) and, with ``--workers MIN:MAX``,
start and stop workers on the queues (``ops.autoscaler``). Each instance gets honcho's
``$PORT`` (5000 for the first type, +100 per type, +1 per instance), which names a worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

from ops.preload import ForkedProcess, expand, forkable, preload
from ops.priority import lower_priority, niceness
from ops.stack import procfile_commands, spawn
from ops.supervisor import Child, Process, RespawnPolicy, Supervisor
from trickle.config.sections import SupervisorSettings
from trickle.config.settings import PROJECT_ROOT, Settings, load_settings

PR_SET_PDEATHSIG = 1
BASE_PORT = 5000


def die_with_parent() -> None:
    """Get SIGTERM if the parent dies, so nothing `trickle up` started outlives it."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def parse_concurrency(text: str) -> dict[str, int]:
    """honcho's ``-c web=1,worker=2``."""
    counts: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, number = part.partition("=")
        if not number.isdigit():
            raise ValueError(f"-c expects NAME=COUNT[,NAME=COUNT], got {part!r}")
        counts[name.strip()] = int(number)
    return counts


class ProcfileLauncher:
    """Builds the children of each Procfile process type, numbered as honcho numbers them."""

    def __init__(
        self,
        procfile: Path,
        env: dict[str, str],
        supervisor: Supervisor,
        fork: bool = False,
        priorities: SupervisorSettings | None = None,
    ) -> None:
        self.commands = procfile_commands(procfile)
        self.env = env
        self.supervisor = supervisor
        self.fork = fork
        self.priorities = priorities or SupervisorSettings()
        base = int(env.get("PORT", BASE_PORT))
        self.base_ports = {kind: base + 100 * i for i, kind in enumerate(self.commands)}

    def spawn(self, kind: str) -> Child:
        """Start one more instance of a process type, under the lowest free number."""
        taken = {c.name for c in self.supervisor.children.values()}
        index = next(i for i in range(1, 10_000) if f"{kind}.{i}" not in taken)
        name = f"{kind}.{index}"
        port = self.base_ports[kind] + index - 1
        env = {**self.env, "PORT": str(port), "HONCHO_PROCESS_NAME": name}
        command = self.commands[kind]
        nice = niceness(kind, self.priorities)

        argv = expand(command, env)
        if self.fork and forkable(argv):

            def setup() -> None:
                die_with_parent()
                lower_priority(nice)

            return self.supervisor.add(
                Child(
                    name,
                    kind,
                    lambda: ForkedProcess(argv, env, str(PROJECT_ROOT), setup),
                    port=port,
                )
            )

        def launch() -> Process:
            # A group of its own: signalled and cleaned up whole; output to the supervisor.
            argv = ["/bin/sh", "-c", f"exec {command}"]
            return spawn(
                argv, env, subprocess.PIPE, new_session=True, preexec_fn=die_with_parent, nice=nice
            )

        return self.supervisor.add(Child(name, kind, launch, port=port))


def embedded_redis(settings: Settings, data_dir: Path) -> Child | str:
    """The embedded Redis as a supervised child (restarted from its AOF), or why not."""
    from ops.redis_server import port_in_use, start_redis

    port = urlparse(settings.redis.url).port or 6399
    if port_in_use(port):
        return f"port {port} is taken; set TRICKLE_REDIS_URL or free it"

    def launch() -> Process:
        fsync = ("--appendfsync", settings.redis.appendfsync)
        return start_redis(port, data_dir / "redis", extra_args=fsync, new_session=True)

    return Child("redis", "redis", launch, port=port, essential=True)


def run_stack(
    concurrency: str = "",
    workers: str = "",
    procfile: Path | None = None,
    data_dir: Path | None = None,
) -> int:
    die_with_parent()  # make's SIGTERM kills only make; this carries it on to us
    env = dict(os.environ)
    # The Procfile's gunicorn and celery are the ones installed beside this interpreter.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    settings = load_settings(environ=env)
    workers = workers or env.get("TRICKLE_WORKERS", "")
    try:
        counts = parse_concurrency(concurrency)
        from ops.autoscaler import WorkerRange

        bounds = WorkerRange.parse(workers) if workers else None
    except ValueError as exc:
        print(f"trickle up: {exc}", file=sys.stderr)
        return 2
    supervisor = Supervisor(RespawnPolicy.from_settings(settings.supervisor))
    supervisor.install_signal_handlers()
    if "TRICKLE_REDIS_URL" not in env:
        redis_child = embedded_redis(settings, data_dir or PROJECT_ROOT / ".trickle")
        if isinstance(redis_child, str):
            print(redis_child, file=sys.stderr)
            return 1
        supervisor.log(f"embedded Redis on 127.0.0.1:{redis_child.port} (AOF on)")
        supervisor.add(redis_child)
        env["TRICKLE_REDIS_URL"] = f"redis://127.0.0.1:{redis_child.port}/0"
        # Not loaded again: a second load would repeat its warnings (old key names).
        redis_settings = dataclasses.replace(settings.redis, url=env["TRICKLE_REDIS_URL"])
        settings = dataclasses.replace(settings, redis=redis_settings)
    if settings.broker.url:
        from kombu.utils.url import maybe_sanitize_url

        # An external broker (RabbitMQ) is the operator's to run: used, never started here.
        supervisor.log(f"job queue on {maybe_sanitize_url(settings.broker.url)}")
    fork = settings.supervisor.preload_workers
    if fork and (why := preload()):
        supervisor.log(f"workers start by exec (preloading failed: {why})")
        fork = False
    launcher = ProcfileLauncher(
        procfile or PROJECT_ROOT / "Procfile", env, supervisor, fork, settings.supervisor
    )
    if bounds is not None and "worker" not in launcher.commands:
        print("trickle up: --workers needs a `worker` line in the Procfile", file=sys.stderr)
        supervisor.shutdown()
        return 2
    for kind in launcher.commands:
        wanted = bounds.min if bounds is not None and kind == "worker" else counts.get(kind, 1)
        for _ in range(wanted):
            launcher.spawn(kind)
    if bounds is not None:
        from ops.autoscaler import Autoscaler
        from trickle.queue import QueueReader, make_celery
        from trickle.store.job_store import JobStore
        from trickle.store.redis_connection import connect

        client = connect(settings.redis)  # a cluster client for a cluster URL
        store = JobStore(client, settings.limits.result_ttl_seconds, 0)
        queues = QueueReader(make_celery(settings, settings.models), store)
        scaler = Autoscaler(
            supervisor, lambda: launcher.spawn("worker"), settings, bounds, client, queues
        )
        supervisor.on_tick.append(scaler.tick)
        supervisor.log(f"autoscaling workers between {bounds.min} and {bounds.max}")
    return supervisor.run()
