"""Grammar-constrained decoding in the real engine process (worker/engine/constrained.py).

Real CTranslate2 models: the demo model, and a random-weight Llama-style one, where most
tokens the model proposes break the schema. The guarantee must come from the server: every
answer parses and validates, no refused token ever reaches the worker, greedy answers repeat,
and an answer cut by max_tokens still closes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import llguidance
import pytest

from tests.schema_answers import SHAPES, assert_valid, field_schema
from trickle.closure import Closer
from trickle.config.sections import ModelSettings
from trickle.grammar import json_schema_grammar
from trickle.grammar_matcher import MatcherCache
from worker.engine.engine import Engine
from worker.engine.request import EngineRequest, SamplingKey, Scored

GREEDY = SamplingKey(1.0, 1, 1.0, 1.0, False)
SAMPLED = SamplingKey(0.8, 0, 0.95, 1.0, False)
PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
        "mood": {"enum": ["happy", "sad"]},
    },
    "required": ["name", "age", "tags", "mood"],
    "additionalProperties": False,
}
GRAMMAR = llguidance.LLMatcher.grammar_from_json_schema(
    PERSON, defaults={"whitespace_flexible": False}
)


@pytest.fixture(scope="module", params=["demo", "llama"])
def engine(request: pytest.FixtureRequest, demo_model_dir: Path) -> Iterator[Engine]:
    path = demo_model_dir if request.param == "demo" else request.getfixturevalue("llama_model_dir")
    engine = Engine(ModelSettings(name=request.param, path=str(path), device="cpu"))
    yield engine
    engine.close()


def answer(
    engine: Engine, max_new: int, sampling: SamplingKey = GREEDY, **extra: Any
) -> tuple[list[int], list[bool]]:
    ids: list[int] = []
    lasts: list[bool] = []

    def on_step(position: int, step: int, token_id: int, logprob: float | None, last: bool) -> bool:
        ids.append(token_id)
        lasts.append(last)
        return False

    prompt = engine.tokenizer.encode("A person, as JSON: ")
    request = EngineRequest(prompt, max_new, sampling, grammar=GRAMMAR, **extra)
    engine.generate([request], on_step)
    return ids, lasts


def collect(ids: list[int]) -> Any:
    """An ``on_step`` that keeps the token ids."""
    return lambda position, step, token, logprob, last: ids.append(token) or False


def text_of(engine: Engine, ids: list[int]) -> str:
    return engine.tokenizer.decode([i for i in ids if i not in engine.end_ids])


def assert_every_token_was_allowed(engine: Engine, ids: list[int]) -> None:
    """Replays the answer through a fresh matcher: each token the worker saw was allowed."""
    matcher = MatcherCache(engine.tokenizer).matcher(GRAMMAR)
    for position, token in enumerate(ids):
        if token in engine.end_ids:
            assert matcher.is_accepting(), f"end token at {position} before the answer closed"
            assert position == len(ids) - 1
        else:
            assert matcher.try_consume_tokens([token]) == 1, f"token {position} was refused"


def test_a_greedy_answer_validates_and_repeats(engine: Engine) -> None:
    ids, lasts = answer(engine, 300)
    jsonschema.validate(json.loads(text_of(engine, ids)), PERSON)
    assert_every_token_was_allowed(engine, ids)
    assert lasts[-1] and not any(lasts[:-1])
    assert answer(engine, 300)[0] == ids


def test_sampled_answers_validate(engine: Engine) -> None:
    for _ in range(4):
        ids, _ = answer(engine, 300, SAMPLED)
        jsonschema.validate(json.loads(text_of(engine, ids)), PERSON)
        assert_every_token_was_allowed(engine, ids)


def test_an_answer_cut_by_max_tokens_still_closes(engine: Engine) -> None:
    # Every budget from the shortest answer up: the cut falls inside strings, numbers, keys
    # and forced enum values alike. (Below the shortest answer nothing can close it.)
    shortest = Closer(engine.tokenizer.token_bytes()).closing(
        MatcherCache(engine.tokenizer).matcher(GRAMMAR)
    )
    assert shortest is not None
    for budget in range(len(shortest), len(shortest) + 80, 3):
        for sampling in (GREEDY, SAMPLED):
            ids, lasts = answer(engine, budget, sampling)
            assert len(ids) <= budget
            jsonschema.validate(json.loads(text_of(engine, ids)), PERSON)
            assert_every_token_was_allowed(engine, ids)
            assert lasts[-1]


def test_a_budget_no_answer_fits_is_written_on_not_ended_empty(engine: Engine) -> None:
    """Below the shortest answer (the web tier refuses such a budget; a resumed job's may
    still be) no completion fits, so closing cannot help: the engine let the model write on
    (every token allowed) instead of ending the answer empty at its first step."""
    keys = [f"setting_{i}" for i in range(40)]
    schema = {
        "type": "object",
        "properties": {key: {"type": "boolean"} for key in keys},
        "required": keys,
    }
    grammar = json_schema_grammar(schema, "response_format")
    ids: list[int] = []
    prompt = engine.tokenizer.encode("Settings, as JSON: ")
    engine.generate([EngineRequest(prompt, 24, GREEDY, grammar=grammar)], collect(ids))
    assert len(ids) == 24
    matcher = MatcherCache(engine.tokenizer).matcher(grammar)
    assert matcher.try_consume_tokens(ids) == len(ids)


def test_a_resumed_answer_goes_on_from_what_it_had_streamed(engine: Engine) -> None:
    streamed = '{"name":"Ada","age":3'
    prompt = engine.tokenizer.encode("A person, as JSON: " + streamed)
    ids: list[int] = []
    engine.generate(
        [EngineRequest(prompt, 200, GREEDY, grammar=GRAMMAR, grammar_replay=streamed)],
        lambda position, step, token, logprob, last: ids.append(token) or False,
    )
    jsonschema.validate(json.loads(streamed + text_of(engine, ids)), PERSON)


def test_a_constrained_answer_reports_alternatives_when_asked(engine: Engine) -> None:
    reported: list[Any] = []
    engine.generate(
        [
            EngineRequest(
                engine.tokenizer.encode("A person, as JSON: "),
                120,
                GREEDY,
                grammar=GRAMMAR,
                top_logprobs=3,
            )
        ],
        lambda position, step, token, logprob, last: reported.append(logprob) or False,
    )
    scored = [entry for entry in reported if isinstance(entry, Scored)]
    # Tokens the model proposed carry their alternatives; forced ones (no model step) none.
    assert scored and all(len(entry.top) == 3 for entry in scored)
    assert all(entry is None or isinstance(entry, Scored) for entry in reported)


def test_a_seeded_constrained_answer_repeats(engine: Engine) -> None:
    answers = [answer(engine, 200, SAMPLED, seed=7)[0] for _ in range(3)]
    assert answers[0] == answers[1] == answers[2]
    jsonschema.validate(json.loads(text_of(engine, answers[0])), PERSON)
    assert answer(engine, 200, SAMPLED, seed=8)[0] != answers[0]


def test_a_model_that_ends_early_gets_its_answer_closed(demo_model_dir: Path) -> None:
    """The demo model ends its answers after a sentence or a few; inside an open string the
    grammar refuses that end, and the answer closes there and ends (not steered on to
    max_tokens, where it would end as cut)."""
    text_schema = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        text_schema, defaults={"whitespace_flexible": False}
    )
    engine = Engine(ModelSettings(name="demo", path=str(demo_model_dir), device="cpu"))
    try:
        request = EngineRequest(
            engine.tokenizer.encode("Tell me about sockets."), 400, SAMPLED, grammar=grammar
        )
        for seed in range(5):
            ids: list[int] = []
            engine.generate([dataclasses.replace(request, seed=seed)], collect(ids))
            assert ids[-1] in engine.end_ids and len(ids) < 400
            jsonschema.validate(json.loads(text_of(engine, ids)), text_schema)
    finally:
        engine.close()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_formats_and_patterns_validate_greedy_sampled_and_cut(engine: Engine, shape: str) -> None:
    """Where the model fights the grammar hardest (the random-weight Llama), and where a model
    that wants to end inside the string is refused: every answer parses and validates, its
    format or pattern included, whole or cut at max_tokens, from the shortest budget up."""
    schema = field_schema(SHAPES[shape])
    grammar = json_schema_grammar(schema, "response_format")
    shortest = Closer(engine.tokenizer.token_bytes()).shortest(
        MatcherCache(engine.tokenizer).matcher(grammar)
    )
    assert shortest is not None
    prompt = engine.tokenizer.encode("A record, as JSON: ")
    for budget in (len(shortest), len(shortest) + 7, 60):
        for sampling in (GREEDY, SAMPLED):
            ids: list[int] = []
            engine.generate(
                [EngineRequest(prompt, budget, sampling, grammar=grammar, seed=budget)],
                collect(ids),
            )
            assert len(ids) <= budget
            assert_valid(schema, text_of(engine, ids))
