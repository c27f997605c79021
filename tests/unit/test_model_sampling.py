"""A model's sampling defaults: the configuration's table, else generation_config.json's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from trickle.config.sampling import ModelSampling, SamplingDefaults, resolve_sampling
from trickle.config.sections import ModelSettings
from trickle.model_files import model_profile

TABLE = TypeAdapter(ModelSampling)


def test_none_set_anywhere_leaves_the_apis_defaults() -> None:
    assert resolve_sampling(ModelSampling(), {}) == SamplingDefaults()


def test_the_files_values_as_vllm_reads_them() -> None:
    qwen = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    assert resolve_sampling(ModelSampling(), {**qwen, "max_new_tokens": 512}) == SamplingDefaults(
        temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05, max_tokens=512
    )


def test_the_configuration_wins_field_by_field() -> None:
    table = TABLE.validate_python({"temperature": 0.2, "max_tokens": 64})
    resolved = resolve_sampling(table, {"temperature": 0.7, "top_p": 0.8, "max_new_tokens": 9})
    assert resolved == SamplingDefaults(temperature=0.2, top_p=0.8, max_tokens=64)


def test_a_files_value_out_of_range_or_of_the_wrong_type_is_skipped() -> None:
    odd = {"temperature": 5.0, "top_p": 1e-50, "top_k": 5000, "repetition_penalty": 1e-50}
    assert resolve_sampling(ModelSampling(), odd) == SamplingDefaults()
    assert resolve_sampling(ModelSampling(), {"top_k": True, "top_p": "high"}) == SamplingDefaults()


@pytest.mark.parametrize(
    "table",
    [
        {"temperature": 2.5},
        {"top_p": 0},
        {"top_k": -1},
        {"repetition_penalty": 0},
        {"max_tokens": 0},
    ],
)
def test_a_configured_value_out_of_range_is_refused(table: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        TABLE.validate_python(table)


def test_the_profile_reads_the_directorys_generation_config(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": 2, "temperature": 0.6, "top_p": 0.9, "do_sample": True})
    )
    profile = model_profile(ModelSettings("m", str(tmp_path)))
    assert profile.sampling == SamplingDefaults(temperature=0.6, top_p=0.9)
