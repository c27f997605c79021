"""Real processes for the tests: a Celery worker and a gunicorn web server on a test config."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from contextlib import closing
from pathlib import Path

import requests

from trickle import keys
from trickle.config.sections import RedisSettings
from trickle.config.settings import PROJECT_ROOT
from trickle.store.redis_connection import connect

BIN = Path(sys.executable).parent


def child_env(config_path: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRICKLE")}
    env.update({"TRICKLE_CONFIG": str(config_path), "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


def start_worker(
    config_path: Path,
    redis_url: str,
    name: str,
    log_dir: Path,
    models: tuple[str, ...] = ("demo",),
    extra_env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """A real `celery worker` process; returns once it heartbeats for every model it serves."""
    env = child_env(config_path, {"TRICKLE_MODELS": ",".join(models), **(extra_env or {})})
    log_path = log_dir / f"{name}.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [
                str(BIN / "celery"), "-A", "worker.app", "worker", "--loglevel", "INFO",
                "--hostname", f"{name}@%h", "--without-gossip", "--without-mingle",
            ],
            cwd=PROJECT_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 90
    with closing(connect(RedisSettings(url=redis_url))) as client:  # a cluster URL too
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"worker {name} exited; see {log_path}")
            members = [set(client.zrange(keys.model_workers(m), 0, -1)) for m in models]
            if all(any(member.startswith(name + "@") for member in found) for found in members):
                return process
            if time.monotonic() > deadline:
                process.kill()
                raise TimeoutError(f"worker {name} never became ready; see {log_path}")
            time.sleep(0.1)


def start_web(
    config_path: Path,
    port: int,
    log_dir: Path,
    extra_env: Mapping[str, str] | None = None,
    name: str = "web",
) -> subprocess.Popen[bytes]:
    """gunicorn with the gevent worker, exactly as the Procfile runs it."""
    # With gunicorn's access log, as an operator would turn it on: tests read its status lines.
    env = child_env(
        config_path,
        {"TRICKLE_PORT": str(port), "GUNICORN_CMD_ARGS": "--access-logfile -", **(extra_env or {})},
    )
    log_path = log_dir / f"{name}.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [str(BIN / "gunicorn"), "--config", "python:web.gunicorn_conf", "web:create_app()"],
            cwd=PROJECT_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"web server exited; see {log_path}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).ok:
                return process
        except requests.RequestException:
            pass  # not listening yet, or too busy starting to answer
        if time.monotonic() > deadline:
            process.kill()
            raise TimeoutError(f"web server never answered; see {log_path}")
        time.sleep(0.1)


def stop(process: subprocess.Popen[bytes], timeout: float = 15) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
