"""Fork-started workers: the launcher pays the worker's imports once, each start then forks.

A worker's cold start is mostly Python, not the model: on the 2-core test machine importing
Celery, its CLI, CTranslate2 and numpy takes about 1.1 s of CPU, and much longer in wall time
when the machine is busy, while the demo model loads and warms up in 0.3 s. So `trickle up`
imports those modules once, at launch, and starts each Procfile ``celery`` process by forking
itself and running the same command line in the child (what Gunicorn's ``preload_app`` and
the forkserver of serverless runtimes do). Everything else (settings, the Celery app, the
models) is still built in the child, from its own environment. A command that is not
``celery ...`` is exec'ed as before; so is every command when preloading fails.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import IO

PRELOADED = (
    "numpy",
    "ctranslate2",
    "sentencepiece",
    "tokenizers",
    "celery.bin.celery",
    "celery.apps.worker",
    "celery.worker.consumer",
    "worker.runtime",
    "worker.tasks",
    # Everything worker.app imports, not worker.app itself: importing it builds the Celery app
    # from the environment, which each forked worker must do from its own.
    "worker.dispatch",
)
_VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)")


def preload() -> str:
    """Import what a worker needs; returns "" or why preloading is off (then exec is used)."""
    try:
        for name in PRELOADED:
            importlib.import_module(name)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def expand(command: str, env: Mapping[str, str]) -> list[str]:
    """The Procfile line as argv: ``$VAR`` and ``${VAR:-default}`` expanded, then shell-split."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        return env.get(name) or (match.group(2) or "")

    return [_VARIABLE.sub(value, word) for word in shlex.split(command)]


def forkable(argv: list[str]) -> bool:
    return bool(argv) and os.path.basename(argv[0]) == "celery"


class ForkedProcess:
    """The parts of ``subprocess.Popen`` the supervisor uses, for a forked child."""

    def __init__(
        self, argv: list[str], env: Mapping[str, str], cwd: str, setup: Callable[[], None]
    ):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child, which never returns
            os.close(read)
            _run_child(argv, env, cwd, write, setup)
        os.close(write)
        self.pid = pid
        self.args = argv
        self.returncode: int | None = None
        self.stdout: IO[bytes] | None = os.fdopen(read, "rb")

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"pid {self.pid} still running after {timeout}s")
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode


def _run_child(
    argv: list[str], env: Mapping[str, str], cwd: str, output: int, setup: Callable[[], None]
) -> None:  # pragma: no cover - child side
    code = 1
    try:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        os.setsid()
        setup()
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.closerange(3, 1024)  # nothing of the launcher's (pipes, Redis) leaks into the worker
        # Fresh streams: the launcher's may have been locked by one of its threads at the fork.
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = list(argv)
        from celery.bin.celery import main

        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
