"""Start the Procfile's processes one at a time, wait until they serve, and stop them.

`trickle up` supervises every Procfile line (``ops.launcher``); the system tests and the
benchmarks start the same lines one by one, on a config, ports and logs of their own, so that
they can kill, restart or measure each. Both read the commands here, so what the tests and
the benchmarks run is what operators run. The options are what each caller needs: extra
environment, a worker's node name, a log file (or the supervisor's pipe), a process group of
its own (to kill a whole tree at once), and how long to wait.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from contextlib import closing
from pathlib import Path
from typing import IO

import redis
from honcho.environ import parse_procfile

from ops.preload import expand
from ops.priority import lower_priority, niceness
from ops.redis_server import free_port, start_redis, stop_process, stop_redis
from trickle import keys
from trickle.config.sections import RedisSettings, SupervisorSettings
from trickle.config.settings import PROJECT_ROOT, load_settings
from trickle.store.redis_connection import connect

BIN = Path(sys.executable).parent
PROCFILE = PROJECT_ROOT / "Procfile"
STOP_TIMEOUT_SECONDS = 15.0


def procfile_commands(procfile: Path = PROCFILE) -> dict[str, str]:
    """The Procfile's command line per process type, in file order."""
    return dict(parse_procfile(procfile.read_text()).processes)


def procfile_argv(kind: str, env: Mapping[str, str], node: str = "") -> list[str]:
    """The Procfile's ``kind`` line as argv, run by the binary beside this interpreter;
    ``node`` replaces a worker's Celery node name (``<node>@%h``)."""
    argv = expand(procfile_commands()[kind], env)
    argv[0] = str(BIN / argv[0])
    if node:
        if "--hostname" in argv:
            at = argv.index("--hostname")
            del argv[at : at + 2]
        argv += ["--hostname", f"{node}@%h"]
    return argv


def child_env(config_path: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without any TRICKLE setting of its own, on ``config_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRICKLE")}
    env.update({"TRICKLE_CONFIG": str(config_path), "PYTHONUNBUFFERED": "1", **(extra or {})})
    return env


def spawn(
    argv: list[str],
    env: Mapping[str, str],
    output: Path | int,
    new_session: bool = False,
    preexec_fn: Callable[[], None] | None = None,
    nice: int = 0,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in the project root, stdout and stderr to a log file (appended) or a
    pipe; ``new_session``: a process group of its own, signalled whole by ``kill_group``;
    ``nice``: its nice value (``ops.priority``). A function runs in the child before the exec
    only when one is needed (a hook, a nice value): in a parent with threads, as the tests and
    benchmarks are, Python's docs warn that ``preexec_fn`` can deadlock the child."""
    with contextlib.ExitStack() as files:
        log: IO[bytes] | int = (
            files.enter_context(output.open("ab")) if isinstance(output, Path) else output
        )
        return subprocess.Popen(
            argv, cwd=PROJECT_ROOT, env=dict(env), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=new_session, preexec_fn=child_setup(preexec_fn, nice),
        )  # fmt: skip


def child_setup(preexec_fn: Callable[[], None] | None, nice: int) -> Callable[[], None] | None:
    """What the child runs before its exec: ``preexec_fn``, then its nice value; None when
    that is nothing (no hook, and a nice value of 0 changes nothing: ``lower_priority``)."""
    if nice <= 0:
        return preexec_fn

    def setup() -> None:
        if preexec_fn is not None:
            preexec_fn()
        lower_priority(nice)

    return setup


def wait_until(
    ready: Callable[[], bool], process: subprocess.Popen[bytes], timeout: float, what: str
) -> subprocess.Popen[bytes]:
    """Poll ``ready`` until it holds; a process that exits or never gets there is an error
    (and one that never gets there is killed)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited")
        if time.monotonic() > deadline:
            process.kill()
            raise TimeoutError(f"{what} never became ready")
        time.sleep(0.1)
    return process


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 (not listening yet, or too busy starting, is False)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def start_web(
    env: Mapping[str, str], port: int, output: Path, new_session: bool = False, timeout: float = 60
) -> subprocess.Popen[bytes]:
    """gunicorn as the Procfile runs it, on ``port``; returns once /healthz answers."""
    env = {**env, "TRICKLE_PORT": str(port)}
    process = spawn(procfile_argv("web", env), env, output, new_session)
    ready = lambda: answers(f"http://127.0.0.1:{port}/healthz")  # noqa: E731
    return wait_until(ready, process, timeout, f"web server (see {output})")


def start_worker(
    env: Mapping[str, str],
    redis_url: str,
    node: str,
    models: tuple[str, ...],
    output: Path,
    new_session: bool = False,
    timeout: float = 90,
) -> subprocess.Popen[bytes]:
    """A Celery worker as the Procfile runs it, named ``node``, serving ``models``; returns
    once it heartbeats for each (Redis may be down a moment meanwhile)."""
    env = {**env, "TRICKLE_MODELS": ",".join(models)}
    process = spawn(procfile_argv("worker", env, node), env, output, new_session)
    with closing(connect(RedisSettings(url=redis_url))) as client:  # a cluster URL too

        def ready() -> bool:
            with contextlib.suppress(redis.RedisError):
                found = [set(client.zrange(keys.model_workers(m), 0, -1)) for m in models]
                return all(any(str(w).startswith(node + "@") for w in f) for f in found)
            return False

        return wait_until(ready, process, timeout, f"worker {node} (see {output})")


def start_batch(
    env: Mapping[str, str],
    output: Path,
    priorities: SupervisorSettings,
    new_session: bool = False,
    timeout: float = 60,
) -> subprocess.Popen[bytes]:
    """The batch consumer as the Procfile runs it, at the nice value ``priorities`` (its
    config's ``[supervisor]``) gives it; returns once Celery logs it ready (past what ``output``
    held before: a restart appends to the same log)."""
    start = output.stat().st_size if output.exists() else 0
    nice = niceness("batch", priorities)
    process = spawn(procfile_argv("batch", env), env, output, new_session, nice=nice)

    def ready() -> bool:
        with output.open("rb") as log:
            log.seek(start)
            return b" ready." in log.read()

    return wait_until(ready, process, timeout, f"batch consumer (see {output})")


def stop(process: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_SECONDS) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; always reaps."""
    stop_process(process, timeout)


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process started with ``new_session`` and everything in its group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)


class LocalStack:
    """Redis, one web tier, the batch consumer and named workers on one config file, each
    started, stopped or killed on its own and restarted at the same address, as a supervisor
    restarts them: the stack that fault tests and chaos benchmarks break on purpose.

    ``config`` turns the Redis URL into the file's text. ``append_only`` and ``redis_args``
    apply at every start of Redis (which starts here). ``own_groups`` runs the web tier and
    each worker in a process group of its own, so that a kill takes the whole tree (gunicorn's
    workers, a worker's engine process) at once, as a container's end would. Each part logs
    to ``<log_dir>/<name>.log``, its restarts appended.
    """

    def __init__(
        self,
        root: Path,
        config: Callable[[str], str],
        append_only: bool = False,
        redis_args: tuple[str, ...] = (),
        own_groups: bool = False,
        config_name: str = "trickle.toml",
    ) -> None:
        self.log_dir = root / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.redis_dir = root / "redis"
        self.redis_port, self.web_port = free_port(), free_port()
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.web_url = f"http://127.0.0.1:{self.web_port}"
        self.config_path = root / config_name
        self.config_path.write_text(config(self.redis_url))
        # Read once, here: what the stack itself needs of the config (the batch nice value).
        self.priorities = load_settings(self.config_path, environ={}).supervisor
        self.redis_args, self.own_groups = redis_args, own_groups
        self.web_process: subprocess.Popen[bytes] | None = None
        self.batch_process: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.redis_process = start_redis(
            self.redis_port, self.redis_dir, append_only=append_only, extra_args=redis_args
        )

    def start_redis(self, append_only: bool) -> None:
        """Redis again, on its port, from its files (its append-only file with ``append_only``)."""
        self.redis_process = start_redis(
            self.redis_port, self.redis_dir, append_only=append_only, extra_args=self.redis_args
        )

    def stop_redis(self) -> None:
        stop_redis(self.redis_process)

    def start_web(self, env: Mapping[str, str] | None = None, timeout: float = 60) -> None:
        log = self.log_dir / "web.log"
        env = child_env(self.config_path, env)
        self.web_process = start_web(env, self.web_port, log, self.own_groups, timeout)

    def start_batch(self, env: Mapping[str, str] | None = None, timeout: float = 60) -> None:
        log = self.log_dir / "batch.log"
        env = child_env(self.config_path, env)
        self.batch_process = start_batch(env, log, self.priorities, self.own_groups, timeout)

    def start_worker(
        self,
        name: str,
        models: tuple[str, ...],
        env: Mapping[str, str] | None = None,
        timeout: float = 90,
    ) -> subprocess.Popen[bytes]:
        log = self.log_dir / f"{name}.log"
        full_env = child_env(self.config_path, env)
        process = start_worker(
            full_env, self.redis_url, name, models, log, self.own_groups, timeout
        )
        self.workers.append(process)
        return process

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL a part (its whole group with ``own_groups``) and reap it."""
        if self.own_groups:
            kill_group(process)
        else:
            process.kill()
            process.wait(10)

    def stop_workers(self) -> None:
        for process in self.workers:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)  # one a test stopped must see SIGTERM
            self._stop(process)
        self.workers = []

    def close(self) -> None:
        """Stop everything, workers first; safe to call more than once."""
        self.stop_workers()
        for process in (self.batch_process, self.web_process):
            if process is not None:
                self._stop(process)
        self.batch_process = self.web_process = None
        stop_redis(self.redis_process)

    def _stop(self, process: subprocess.Popen[bytes]) -> None:
        stop(process)
        if self.own_groups:
            kill_group(process)  # anything the leader left behind
