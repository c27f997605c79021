"""A separate stack (own Redis, web tier and config) for tests that kill and restart things."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from ops.redis_server import free_port, start_redis, stop_redis
from tests import stack
from tests.clients import get_job


@dataclass
class FaultStack:
    config_path: Path
    redis_port: int
    redis_dir: Path
    log_dir: Path
    redis_process: subprocess.Popen[bytes]
    web_url: str = ""
    web_process: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    redis_args: tuple[str, ...] = ()  # given to redis-server at every start

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, decode_responses=True)

    def worker(self, name: str, models: tuple[str, ...], **env: str) -> subprocess.Popen[bytes]:
        process = stack.start_worker(
            self.config_path, self.redis_url, name, self.log_dir, models=models, extra_env=env
        )
        self.workers.append(process)
        return process

    def stop_redis(self) -> None:
        stop_redis(self.redis_process)

    def start_redis(self, append_only: bool) -> None:
        self.redis_process = start_redis(
            self.redis_port, self.redis_dir, append_only=append_only, extra_args=self.redis_args
        )

    def stop_workers(self) -> None:
        for process in self.workers:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
            stack.stop(process)
        self.workers = []

    def close(self) -> None:
        self.stop_workers()
        if self.web_process is not None:
            stack.stop(self.web_process)
        stop_redis(self.redis_process)


def build_fault_stack(
    root: Path,
    models_toml: str,
    settings_toml: str,
    append_only: bool = False,
    redis_args: tuple[str, ...] = (),
    web_env: Mapping[str, str] | None = None,
) -> FaultStack:
    port = free_port()
    redis_dir = root / "redis"
    process = start_redis(port, redis_dir, append_only=append_only, extra_args=redis_args)
    config = root / "faults.toml"
    config.write_text(
        f'default_model = "demo"\n[redis]\nurl = "redis://127.0.0.1:{port}/0"\n'
        f"{settings_toml}\n{models_toml}\n"
    )
    log_dir = root / "logs"
    log_dir.mkdir()
    faults = FaultStack(config, port, redis_dir, log_dir, process, redis_args=redis_args)
    web_port = free_port()
    try:
        faults.web_process = stack.start_web(config, web_port, log_dir, extra_env=web_env)
    except Exception:
        stop_redis(process)
        raise
    faults.web_url = f"http://127.0.0.1:{web_port}"
    return faults


def wait_for(
    condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def tokens_streamed(base: str, job_id: str) -> int:
    return int(get_job(base, job_id)["usage"]["completion_tokens"])


def build_slow_model(
    root: Path, tokenizer: Path, d_model: int = 384, num_layers: int = 6, ffn_dim: int = 1152
) -> Path:
    """A random Llama-style model (built offline into ``root / "slow"``) slow enough that a
    1,500-token job on one thread still runs while a test kills, stalls or hands off its
    worker. The default shape takes several seconds on a fast core; modules whose jobs must end
    sooner pass a smaller one, and a deadline test a larger one."""
    from ops.model_builders.random_llama import build_random_llama

    return build_random_llama(
        root / "slow", tokenizer, d_model=d_model, num_layers=num_layers, ffn_dim=ffn_dim
    )


def build_slow_demo_stack(root: Path, tokenizer: Path, settings_toml: str = "") -> FaultStack:
    """A stack whose ``demo`` is a small slow model on one engine thread, served by one worker:
    a few hundred tokens take long enough to watch a stream grow or stop it mid-way."""
    slow = build_slow_model(root, tokenizer)
    faults = build_fault_stack(
        root, f'[models.demo]\npath = "{slow}"\ninter_threads = 1\n', settings_toml
    )
    faults.worker("slow-demo", ("demo",))
    return faults
