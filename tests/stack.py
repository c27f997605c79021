"""Real processes for the tests: a Celery worker and a gunicorn web server on a test config,
started by ``ops.stack`` as the Procfile runs them, each logging to ``<log_dir>/<name>.log``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from subprocess import Popen

from ops import stack
from ops.stack import child_env, stop
from trickle.config.sections import SupervisorSettings

__all__ = ["ACCESS_LOG", "child_env", "start_batch", "start_web", "start_worker", "stop"]

# gunicorn's access log, as an operator would turn it on: tests read its status lines.
ACCESS_LOG = {"GUNICORN_CMD_ARGS": "--access-logfile -"}


def start_worker(
    config_path: Path,
    redis_url: str,
    name: str,
    log_dir: Path,
    models: tuple[str, ...] = ("demo",),
    extra_env: Mapping[str, str] | None = None,
    timeout: float = 90,
) -> Popen[bytes]:
    """A real `celery worker` process; returns once it heartbeats for every model it serves
    (``timeout``: seconds to load them, warm-up steps included)."""
    env = child_env(config_path, extra_env)
    output = log_dir / f"{name}.log"
    return stack.start_worker(env, redis_url, name, models, output, timeout=timeout)


def start_batch(
    config_path: Path,
    log_dir: Path,
    priorities: SupervisorSettings,
    extra_env: Mapping[str, str] | None = None,
) -> Popen[bytes]:
    """The batch consumer (the Procfile's ``batch`` line), at the nice value ``priorities``
    (the config's ``[supervisor]``) gives it; returns once Celery says ready."""
    env = child_env(config_path, extra_env)
    return stack.start_batch(env, log_dir / "batch.log", priorities)


def start_web(
    config_path: Path,
    port: int,
    log_dir: Path,
    extra_env: Mapping[str, str] | None = None,
    name: str = "web",
) -> Popen[bytes]:
    """gunicorn with the gevent worker, exactly as the Procfile runs it."""
    env = child_env(config_path, {**ACCESS_LOG, **(extra_env or {})})
    return stack.start_web(env, port, log_dir / f"{name}.log")
