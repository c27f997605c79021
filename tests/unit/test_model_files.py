"""What a model directory says about itself, under the configuration's explicit keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trickle.config.sections import ModelSettings
from trickle.config.settings import ConfigError
from trickle.model_files import ModelProfile, model_profile


def model_dir(tmp_path: Path, tokenizer: object = None, generation: object = None) -> Path:
    if tokenizer is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


def test_without_files_the_model_is_served_as_before(tmp_path: Path) -> None:
    assert model_profile(ModelSettings("m", str(tmp_path))) == ModelProfile()


def test_the_files_are_read(tmp_path: Path) -> None:
    path = model_dir(
        tmp_path,
        {
            "chat_template": [
                {"name": "tool_use", "template": "x"},
                {"name": "default", "template": "T"},
            ],
            "bos_token": {"content": "<|begin|>", "lstrip": False},
            "eos_token": "<|end|>",
            "add_bos_token": False,
        },
        {"eos_token_id": [2, 7]},
    )
    expected = ModelProfile("T", "<|begin|>", "<|end|>", False, (2, 7), ("<|end|>",))
    assert model_profile(ModelSettings("m", str(path))) == expected


def test_an_int_end_token_and_explicit_keys_override(tmp_path: Path) -> None:
    path = model_dir(tmp_path, {"chat_template": "T", "add_bos_token": False}, {"eos_token_id": 5})
    assert model_profile(ModelSettings("m", str(path))).end_token_ids == (5,)
    explicit = ModelSettings("m", str(path), add_bos=True, chat_template="C", eos_token_ids=(9,))
    profile = model_profile(explicit)
    assert (profile.chat_template, profile.add_bos, profile.end_token_ids) == ("C", True, (9,))


@pytest.mark.parametrize(
    ("tokenizer", "generation"),
    [
        ("not json", None),
        ([1], None),
        (None, {"eos_token_id": "2"}),
        (None, {"eos_token_id": [True]}),
    ],
)
def test_bad_files_name_themselves(tmp_path: Path, tokenizer: object, generation: object) -> None:
    if tokenizer == "not json":
        (tmp_path / "tokenizer_config.json").write_text("{")
        tokenizer = None
    path = model_dir(tmp_path, tokenizer, generation)
    with pytest.raises(ConfigError, match=r"_config\.json"):
        model_profile(ModelSettings("m", str(path)))
