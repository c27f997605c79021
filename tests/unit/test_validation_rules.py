"""The validation rules as pure functions: defaults, inclusive bounds, exact messages."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from trickle.config.sampling import ModelSampling
from trickle.config.settings import Settings
from trickle.params import (
    MAX_REPETITION_PENALTY,
    MAX_TOP_K,
    MIN_REPETITION_PENALTY,
    MIN_TOP_P,
    GenerationParams,
)
from web.common.errors import HttpError
from web.common.request_models import MAX_SEED, RequestModels
from web.common.validation import (
    check_prompt_length,
    generation_params,
    parse_after,
    parse_wait,
    validate,
)


def parse_sampling(body: dict[str, Any], settings: Settings) -> GenerationParams:
    """The sampling fields of a job request, through the bound request model."""
    request = validate(RequestModels.bound_to(settings).job, {"prompt": "x", **body})
    return generation_params(request, settings, settings.default_model)


def refused(call: Any, *args: Any) -> HttpError:
    with pytest.raises(HttpError) as caught:
        call(*args)
    assert caught.value.status == 400
    return caught.value


def test_sampling_defaults(settings: Settings) -> None:
    params = parse_sampling({}, settings)
    assert params == GenerationParams(
        max_tokens=settings.limits.default_max_tokens,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        stop=(),
        seed=None,
        ignore_eos=False,
        repetition_penalty=1.0,
    )


def with_sampling(settings: Settings, tmp_path: Path, **table: Any) -> Settings:
    """``settings`` whose default model has ``[sampling]`` ``table`` and an empty directory."""
    model = settings.model(settings.default_model)
    sampling = TypeAdapter(ModelSampling).validate_python(table)
    changed = dataclasses.replace(model, path=str(tmp_path), sampling=sampling)
    return dataclasses.replace(settings, models={**settings.models, model.name: changed})


def test_a_field_left_out_gets_the_models_default_and_a_sent_one_wins(
    settings: Settings, tmp_path: Path
) -> None:
    tuned = with_sampling(
        settings, tmp_path, temperature=0.2, top_p=0.9, top_k=20, repetition_penalty=1.1
    )
    params = parse_sampling({}, tuned)
    assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty) == (
        0.2,
        0.9,
        20,
        1.1,
    )
    assert params.max_tokens == settings.limits.default_max_tokens
    sent = parse_sampling(
        {"temperature": 0, "top_p": 1, "top_k": 0, "repetition_penalty": 1.0}, tuned
    )
    assert (sent.temperature, sent.top_p, sent.top_k, sent.repetition_penalty) == (0, 1, 0, 1)


def test_a_models_max_tokens_default_replaces_the_limits_one_within_the_ceiling(
    settings: Settings, tmp_path: Path
) -> None:
    ceiling = settings.limits.max_tokens_ceiling
    assert settings.limits.default_max_tokens < ceiling - 1
    for table, expected in ((ceiling - 1, ceiling - 1), (ceiling + 5, ceiling)):
        tuned = with_sampling(settings, tmp_path, max_tokens=table)
        assert parse_sampling({}, tuned).max_tokens == expected
    tuned = with_sampling(settings, tmp_path, max_tokens=9)
    assert parse_sampling({"max_tokens": 3}, tuned).max_tokens == 3


@pytest.mark.parametrize(
    ("name", "edges", "outside"),
    [
        ("temperature", (0.0, 2.0), (-0.001, 2.001)),
        ("top_k", (0, MAX_TOP_K), (-1, MAX_TOP_K + 1)),
        ("top_p", (MIN_TOP_P, 1.0), (0.0, 1.001)),
        ("seed", (0, MAX_SEED), (-1, MAX_SEED + 1)),
        ("max_tokens", (1, 1024), (0, 1025)),
        (
            "repetition_penalty",
            (MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY),
            (0.0099, 10.01),
        ),
    ],
)
def test_bounds_are_inclusive_and_exact(
    settings: Settings, name: str, edges: tuple[float, float], outside: tuple[float, float]
) -> None:
    for value in edges:
        assert getattr(parse_sampling({name: value}, settings), name) == value
    for value in outside:
        error = refused(parse_sampling, {name: value}, settings)
        assert error.param == name
        assert error.message.startswith(f"{name}: Input should be ")


def test_number_messages(settings: Settings) -> None:
    error = refused(parse_sampling, {"temperature": 3}, settings)
    assert error.message == "temperature: Input should be less than or equal to 2"
    assert refused(parse_sampling, {"top_p": "x"}, settings).message == (
        "top_p: Input should be a valid number"
    )
    assert refused(parse_sampling, {"top_p": float("nan")}, settings).param == "top_p"
    assert refused(parse_sampling, {"temperature": True}, settings).param == "temperature"
    assert parse_sampling({"temperature": 1}, settings).temperature == 1.0
    assert isinstance(parse_sampling({"temperature": 1}, settings).temperature, float)
    assert parse_sampling({"ignore_eos": True}, settings).ignore_eos is True
    assert refused(parse_sampling, {"ignore_eos": 1}, settings).message == (
        "ignore_eos: Input should be a valid boolean"
    )


def test_stop_rules(settings: Settings) -> None:
    assert parse_sampling({"stop": "END"}, settings).stop == ("END",)
    assert parse_sampling({"stop": ["a", "b"]}, settings).stop == ("a", "b")
    longest = "x" * settings.limits.max_stop_chars
    assert parse_sampling({"stop": [longest] * 4}, settings).stop == (longest,) * 4
    cases = [
        ({"stop": 5}, "stop must be a string or a list of strings"),
        ({"stop": ["a", 5]}, "stop: Input should be a valid string"),
        ({"stop": ["a"] * 5}, "stop: List should have at most 4 items after validation, not 5"),
        ({"stop": [""]}, "stop: String should have at least 1 character"),
        ({"stop": [longest + "x"]}, "stop: String should have at most 64 characters"),
        (
            {"stop": ["\ud800"]},
            "stop contains an unpaired surrogate (JSON escapes that are not text)",
        ),
    ]
    for body, message in cases:
        error = refused(parse_sampling, body, settings)
        assert (error.param, error.message) == ("stop", message)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, 0.0),
        ("", 0.0),
        ("wait=5", 5.0),
        ("wait=0", 0.0),
        ("wait=2.5", 2.5),
        ('respond-async, wait="7"', 7.0),
        ("handling=lenient, Wait = 3 ", 3.0),
        ("wait=600", 60.0),  # capped
        ("respond-async", 0.0),
    ],
)
def test_prefer_wait(header: str | None, seconds: float) -> None:
    assert parse_wait(header, 60) == seconds


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("wait=soon", "Prefer: wait=N needs a number of seconds"),
        ("wait=-1", "Prefer: wait=N needs a non-negative number"),
        ("wait=inf", "Prefer: wait=N needs a non-negative number"),
    ],
)
def test_bad_prefer_wait(header: str, message: str) -> None:
    error = refused(parse_wait, header, 60)
    assert (error.param, error.message) == ("Prefer", message)


def test_resume_index() -> None:
    assert parse_after(None, "after") == -1
    assert parse_after("", "after") == -1
    assert parse_after("-1", "after") == -1
    assert parse_after("0", "after") == 0
    assert parse_after("41", "Last-Event-ID") == 41
    error = refused(parse_after, "-2", "after")
    assert (error.param, error.message) == ("after", "after must be >= -1")
    error = refused(parse_after, "x", "Last-Event-ID")
    assert (error.param, error.message) == (
        "Last-Event-ID",
        "Last-Event-ID must be an integer token index",
    )


def test_prompt_and_context_limits_are_inclusive(settings: Settings) -> None:
    prompt_limit = settings.limits.max_prompt_tokens
    check_prompt_length(prompt_limit, GenerationParams(max_tokens=1), settings, "demo")
    error = refused(
        check_prompt_length, prompt_limit + 1, GenerationParams(max_tokens=1), settings, "demo"
    )
    assert error.param == "prompt"
    context = settings.model("tiny-llama").max_context_tokens
    fits = GenerationParams(max_tokens=context - 100)
    check_prompt_length(100, fits, settings, "tiny-llama")  # exactly the whole context
    over = GenerationParams(max_tokens=context - 99)
    error = refused(check_prompt_length, 100, over, settings, "tiny-llama")
    assert error.param == "max_tokens"


def test_a_max_tokens_nobody_sent_shrinks_to_the_context_the_prompt_leaves(
    settings: Settings,
) -> None:
    context = settings.model("tiny-llama").max_context_tokens
    defaulted = GenerationParams(max_tokens=context, max_tokens_defaulted=True)
    assert check_prompt_length(100, defaulted, settings, "tiny-llama").max_tokens == context - 100
    roomy = GenerationParams(max_tokens=8, max_tokens_defaulted=True)
    assert check_prompt_length(100, roomy, settings, "tiny-llama").max_tokens == 8
    sent = GenerationParams(max_tokens=context)  # the client's own: refused, as it was
    assert refused(check_prompt_length, 100, sent, settings, "tiny-llama").param == "max_tokens"
    needs = GenerationParams(max_tokens=context, min_tokens=context - 99, max_tokens_defaulted=True)
    assert refused(check_prompt_length, 100, needs, settings, "tiny-llama").param == "max_tokens"
    assert parse_sampling({}, settings).max_tokens_defaulted
    assert not parse_sampling({"max_tokens": 4}, settings).max_tokens_defaulted
