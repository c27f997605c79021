"""Fixtures the system tests share: real engines (CTranslate2 in its own process) per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.scheduler_harness import engine_for
from worker.engine import Engine


@pytest.fixture(scope="module")
def demo_engine(demo_model_dir: Path) -> Iterator[Engine]:
    engine = engine_for(demo_model_dir, "demo")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def llama_engine(llama_model_dir: Path) -> Iterator[Engine]:
    engine = engine_for(llama_model_dir, "tiny-llama")
    yield engine
    engine.close()
