"""Fixtures the system tests share: real engines (CTranslate2 in its own process) per module,
and a stack serving the model that calls tools on cue (``tests.tool_model``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faultstack import FaultStack, build_fault_stack
from tests.scheduler_harness import engine_for
from tests.tool_model import TEMPLATE, build_tool_model
from worker.engine.engine import Engine


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


@pytest.fixture(scope="module")
def tool_model(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build_tool_model(
        tmp_path_factory.mktemp("tool-model"), demo_model_dir / "tokenizer.model"
    )
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return path


@pytest.fixture(scope="module")
def tool_stack(
    tmp_path_factory: pytest.TempPathFactory,
    demo_model_dir: Path,
    tool_model: Path,
    served_model: str,
    served_model_table: str,
    served_worker_timeout: float,
) -> Iterator[FaultStack]:
    """The tool model beside demo, and the served model (SmolLM2 under `make test-real-model`)
    for the ``both_models`` tool tests."""
    stack = build_fault_stack(
        tmp_path_factory.mktemp("tool-stack"),
        models_toml=(
            f'[models.demo]\npath = "{demo_model_dir}"\n'
            f'[models.tools]\npath = "{tool_model}"\nmax_batch_size = 4\n{served_model_table}'
        ),
        settings_toml="[limits]\nmax_tokens_ceiling = 64\ndefault_max_tokens = 32\n",
    )
    models = tuple(dict.fromkeys(("tools", "demo", served_model)))
    stack.start_worker("tools", models, timeout=served_worker_timeout)
    yield stack
    stack.close()
