"""The unit tier: pure logic, no Redis and no processes.

The fixtures that would bring either are replaced by ones that fail, naming the tier a test
belongs in, and starting a subprocess fails the same way: so a test that needs more cannot
quietly slow this tier down.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.conftest import write_test_config
from trickle.config.settings import Settings, load_settings

MESSAGE = "the unit tier runs no {what}: move this test to tests/{tier}"
# The discard port: settings here name a Redis that nothing in this tier may connect to.
UNREACHABLE_REDIS = "redis://127.0.0.1:9/0"


def _refuse(what: str, tier: str) -> NoReturn:
    pytest.fail(MESSAGE.format(what=what, tier=tier), pytrace=False)


@pytest.fixture(scope="session")
def redis_url() -> str:
    _refuse("Redis", "integration")


@pytest.fixture(scope="module")
def private_redis() -> None:
    _refuse("Redis", "integration")


@pytest.fixture(scope="session")
def worker_process() -> None:
    _refuse("worker process", "system")


@pytest.fixture(scope="session")
def web_url() -> str:
    _refuse("web process", "system")


@pytest.fixture(scope="session")
def config_path(
    tmp_path_factory: pytest.TempPathFactory,
    demo_model_dir: Path,
    llama_model_dir: Path,
    scripted_model_dir: Path,
) -> Path:
    """The suite's configuration, for tests of settings and validation that need no Redis."""
    return write_test_config(
        tmp_path_factory.mktemp("config"),
        UNREACHABLE_REDIS,
        demo_model_dir,
        llama_model_dir,
        scripted_model_dir,
    )


@pytest.fixture(scope="session")
def settings(config_path: Path) -> Settings:
    """Its own session fixture, not the root one: a session fixture is cached once, and the
    other tiers' ``settings`` must keep naming their real Redis."""
    return load_settings(config_path, environ={})


@pytest.fixture(autouse=True)
def no_subprocesses(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(*_: Any, **__: Any) -> NoReturn:
        _refuse("subprocess", "integration or tests/system")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    yield
