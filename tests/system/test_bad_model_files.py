"""A model directory the worker cannot serve stops its start with an error that names the
directory and what is wrong, never a served model that answers garbage: one with neither
tokenizer, and one whose tokenizer does not match the weights' vocabulary. (The GGUF
converter's refusals: tests/integration/test_gguf_converter.py and test_cli.py.)"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faultstack import FaultStack, build_fault_stack

MODEL_FILES = ("model.bin", "config.json", "vocabulary.json")


def copy_weights(demo: Path, target: Path) -> Path:
    target.mkdir(parents=True)
    for name in MODEL_FILES:
        shutil.copy(demo / name, target / name)
    return target


@pytest.fixture(scope="module")
def bad_models(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad-models")
    bare = copy_weights(demo_model_dir, root / "bare")
    shuffled = copy_weights(demo_model_dir, root / "shuffled")
    shutil.copy(demo_model_dir / "tokenizer.model", shuffled / "tokenizer.model")
    vocabulary = json.loads((shuffled / "vocabulary.json").read_text())
    vocabulary[10], vocabulary[11] = vocabulary[11], vocabulary[10]
    (shuffled / "vocabulary.json").write_text(json.dumps(vocabulary))
    return {"bare": bare, "shuffled": shuffled}


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path, bad_models: dict[str, Path]
) -> Iterator[FaultStack]:
    models = f'[models.demo]\npath = "{demo_model_dir}"\n' + "".join(
        f'[models.{name}]\npath = "{path}"\n' for name, path in bad_models.items()
    )
    faults = build_fault_stack(tmp_path_factory.mktemp("bad-stack"), models, "")
    yield faults
    faults.close()


@pytest.mark.parametrize(
    ("name", "named"),
    [("bare", "has no tokenizer"), ("shuffled", "vocabulary")],
)
def test_the_worker_refuses_to_start_naming_the_directory(
    stack: FaultStack, bad_models: dict[str, Path], name: str, named: str
) -> None:
    with pytest.raises((RuntimeError, TimeoutError)):
        stack.worker(f"bad-{name}", (name,))
    log = (stack.log_dir / f"bad-{name}.log").read_text(errors="replace")
    assert str(bad_models[name]) in log and named in log, log[-3000:]
