"""A separate stack (own Redis, web tier and config) for tests that kill and restart things."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import redis

from ops.stack import LocalStack
from tests.clients import get_job
from tests.stack import ACCESS_LOG


class FaultStack(LocalStack):
    """``ops.stack.LocalStack`` with the names the fault tests use."""

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, decode_responses=True)

    def worker(self, name: str, models: tuple[str, ...], **env: str) -> subprocess.Popen[bytes]:
        return self.start_worker(name, models, env)


def build_fault_stack(
    root: Path,
    models_toml: str,
    settings_toml: str,
    append_only: bool = False,
    redis_args: tuple[str, ...] = (),
    web_env: Mapping[str, str] | None = None,
    batches: bool = True,
) -> FaultStack:
    """Redis, a web tier and (``batches``) the batch consumer on ``settings_toml`` and
    ``models_toml``, as the Procfile runs them; workers come from each test
    (``FaultStack.worker``)."""

    def config(redis_url: str) -> str:
        head = f'default_model = "demo"\n[redis]\nurl = "{redis_url}"\n'
        return f"{head}{settings_toml}\n{models_toml}\n"

    faults = FaultStack(root, config, append_only, redis_args, config_name="faults.toml")
    try:
        faults.start_web({**ACCESS_LOG, **(web_env or {})})
        if batches:
            faults.start_batch(web_env)
    except Exception:
        faults.close()
        raise
    return faults


def plain_key_stack(
    root: Path, name: str, demo_model_dir: Path, api_keys: tuple[str, ...], model_toml: str
) -> FaultStack:
    """Plain keys (``TRICKLE_API_KEYS``) on a web tier and one demo worker named ``name``: the
    stack the fair-share tests hold one key's flood against another's job on."""
    env = {"TRICKLE_API_KEYS": ",".join(api_keys)}
    stack = build_fault_stack(
        root,
        models_toml=f'[models.demo]\npath = "{demo_model_dir}"\n{model_toml}',
        settings_toml="",
        web_env=env,
    )
    stack.worker(name, ("demo",), **env)
    return stack


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


def build_demo_and_slow_stack(
    root: Path, demo_model_dir: Path, settings_toml: str, more_models_toml: str = ""
) -> FaultStack:
    """The worker-fault modules' stack: ``demo`` and a ``slow`` model big enough that LONG
    takes several seconds on one thread of a fast core (at d_model 256 and 4 layers it took
    1 s, and a one-second deadline raced the job's end), on one engine thread and four rows.
    ``more_models_toml`` may name the slow model's files as ``{slow}``."""
    slow = build_slow_model(
        root, demo_model_dir / "tokenizer.model", d_model=512, num_layers=6, ffn_dim=1536
    )
    models_toml = (
        f'[models.demo]\npath = "{demo_model_dir}"\n'
        f'[models.slow]\npath = "{slow}"\nmax_batch_size = 4\nintra_threads = 1\n'
    ) + more_models_toml.replace("{slow}", str(slow))
    return build_fault_stack(root, models_toml=models_toml, settings_toml=settings_toml)
