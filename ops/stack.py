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
from trickle import keys
from trickle.config.sections import RedisSettings
from trickle.config.settings import PROJECT_ROOT
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
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in the project root, stdout and stderr to a log file (appended) or a
    pipe; ``new_session``: a process group of its own, signalled whole by ``kill_group``."""
    with contextlib.ExitStack() as files:
        log: IO[bytes] | int = (
            files.enter_context(output.open("ab")) if isinstance(output, Path) else output
        )
        return subprocess.Popen(
            argv, cwd=PROJECT_ROOT, env=dict(env), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=new_session, preexec_fn=preexec_fn,
        )  # fmt: skip


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


def stop(process: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_SECONDS) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; always reaps."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process started with ``new_session`` and everything in its group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)
