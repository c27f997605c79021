"""Constrained jobs, and jobs reporting alternatives, share batches (worker/engine/shared_rows.py)
on the real engine process and a real Redis: several of them run as one batch, every answer
validates and was allowed token by token, greedy answers equal the ones each job gets alone,
and the text the worker streamed is the text it stored. The scheduler lets constrained jobs
share only while the model's measured refusals make it pay (worker/engine/sharing_gate.py):
the demo model refuses often, so once it has been measured its bursts run row by row."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import llguidance
import pytest
import redis

from tests.scheduler_harness import CPU_LIKE, Harness, solo_outputs
from trickle.grammar_matcher import MatcherCache
from worker.engine.engine import Engine
from worker.engine.request import EngineRequest, SamplingKey, Scored
from worker.engine.sharing_gate import RefusalRate

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
PROMPTS = [
    "A person, as JSON: ",
    "Return the person",
    "The socket module and a person: ",
    "If the value is a person",
    "Raise",
    "This module provides access to the mathematical functions of a person",
]
GREEDY = SamplingKey(1.0, 1, 1.0, 1.0, False)
SAMPLED = SamplingKey(0.9, 0, 0.95, 1.0, False)


def engine_of(model: str, demo_engine: Engine, llama_engine: Engine) -> Engine:
    return demo_engine if model == "demo" else llama_engine


def generate(engine: Engine, requests: list[EngineRequest]) -> list[list[Any]]:
    """One ``Engine.generate`` of every request: each row's (token, logprob) in order."""
    rows: list[list[Any]] = [[] for _ in requests]

    def on_step(position: int, step: int, token: int, logprob: Any, last: bool) -> bool:
        rows[position].append((token, logprob))
        return False

    engine.generate(requests, on_step)
    return rows


def assert_valid_and_allowed(engine: Engine, ids: list[int]) -> None:
    matcher = MatcherCache(engine.tokenizer).matcher(GRAMMAR)
    for position, token in enumerate(ids):
        if token in engine.end_ids:
            assert matcher.is_accepting() and position == len(ids) - 1
        else:
            assert matcher.try_consume_tokens([token]) == 1, f"token {position} was refused"
    text = engine.tokenizer.decode([t for t in ids if t not in engine.end_ids])
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("model", ["demo", "tiny-llama"])
def test_constrained_rows_of_one_call_each_validate_and_greedy_equals_alone(
    model: str, demo_engine: Engine, llama_engine: Engine
) -> None:
    engine = engine_of(model, demo_engine, llama_engine)
    requests = [
        EngineRequest(engine.tokenizer.encode(prompt), 60 + 20 * i, GREEDY, grammar=GRAMMAR)
        for i, prompt in enumerate(PROMPTS)
    ]
    together = [[token for token, _ in row] for row in generate(engine, requests)]
    for ids in together:
        assert_valid_and_allowed(engine, ids)
    alone = [[token for token, _ in generate(engine, [r])[0]] for r in requests]
    assert together == alone


@pytest.mark.parametrize("model", ["demo", "tiny-llama"])
def test_sampled_constrained_rows_of_one_call_all_validate(
    model: str, demo_engine: Engine, llama_engine: Engine
) -> None:
    engine = engine_of(model, demo_engine, llama_engine)
    requests = [
        EngineRequest(engine.tokenizer.encode(prompt), 120, SAMPLED, grammar=GRAMMAR)
        for prompt in PROMPTS * 2
    ]
    for row in generate(engine, requests):
        assert_valid_and_allowed(engine, [token for token, _ in row])


def test_alternatives_in_a_shared_call_equal_those_alone(demo_engine: Engine) -> None:
    """Rows reporting alternatives beside constrained ones: each row's alternatives come from
    its own logits (greedy: the same as alone)."""
    engine = demo_engine
    requests = [
        EngineRequest(
            engine.tokenizer.encode(prompt),
            40,
            GREEDY,
            grammar=GRAMMAR if i % 2 else None,
            top_logprobs=3,
        )
        for i, prompt in enumerate(PROMPTS[:4])
    ]
    together = generate(engine, requests)
    for request, row in zip(requests, together, strict=True):
        alone = generate(engine, [request])[0]
        assert [token for token, _ in row] == [token for token, _ in alone]
        for (_, shared), (_, own) in zip(row, alone, strict=True):
            if isinstance(own, Scored):  # (a forced token reports none)
                assert isinstance(shared, Scored)
                assert [text for text, _ in shared.top] == [text for text, _ in own.top]
                assert shared.logprob == pytest.approx(own.logprob, abs=1e-4)


def test_constrained_jobs_share_a_batch_through_the_scheduler(
    demo_engine: Engine, private_redis: redis.Redis
) -> None:
    """Nothing refused yet (a fresh estimate): the gate starts optimistic, and they share."""
    specs: list[dict[str, object]] = [
        {"prompt": prompt, "max_tokens": 80, "temperature": 0.0, "grammar": GRAMMAR}
        for prompt in PROMPTS
    ]
    harness = Harness(
        demo_engine, private_redis, max_batch_size=8, wait_ms=200, refusals=RefusalRate()
    )
    try:
        jobs = harness.run([harness.job(**spec) for spec in specs])  # type: ignore[arg-type]
        assert max(harness.scheduler.batch_sizes) == len(specs)  # they really ran together
        stored = [harness.store.get(job.job_id) for job in jobs]
    finally:
        harness.close()
    outputs = [job.state.output for job in jobs]
    for output in outputs:
        jsonschema.validate(json.loads(output), PERSON)
    assert [record.output if record else None for record in stored] == outputs
    assert outputs == solo_outputs(demo_engine, private_redis, specs)


def test_a_constrained_burst_runs_alone_once_the_demo_is_seen_to_refuse_often(
    demo_engine: Engine, private_redis: redis.Redis
) -> None:
    """The engine reports each batch's refusals back; past the break-even rate (CPU-like
    prices, so the threshold does not move with the machine's load) a burst runs row by row,
    and every answer still validates and equals the one each job gets alone."""
    specs: list[dict[str, object]] = [
        {"prompt": prompt, "max_tokens": 80, "temperature": 0.0, "grammar": GRAMMAR}
        for prompt in PROMPTS
    ]
    # A fresh estimate that only the burst's own prompts feed, one at a time: the engine's is
    # shared with every earlier test of the module (their sampled rows refuse less), and once
    # left the rate at 0.352 against a break-even of 0.351.
    earlier, demo_engine.refusals = demo_engine.refusals, RefusalRate()
    harness = Harness(demo_engine, private_redis, max_batch_size=8, wait_ms=200, pricing=CPU_LIKE)
    try:
        for spec in specs:
            harness.run([harness.job(**spec)])  # type: ignore[arg-type]
        measured = demo_engine.refusals.rate
        burst = [harness.job(**spec) for spec in specs]  # type: ignore[arg-type]
        highest = max(harness.scheduler.sharing.break_even(job.request) for job in burst)
        assert measured > highest > 0, (measured, highest)
        sizes_before = len(harness.scheduler.batch_sizes)
        jobs = harness.run(burst)
        sizes = list(harness.scheduler.batch_sizes)[sizes_before:]
        stored = [harness.store.get(job.job_id) for job in jobs]
    finally:
        harness.close()
        demo_engine.refusals = earlier
    assert sizes == [1] * len(specs)  # each row alone
    assert all(job.request.shares_calls is False for job in jobs)
    outputs = [job.state.output for job in jobs]
    for output in outputs:
        jsonschema.validate(json.loads(output), PERSON)
    assert [record.output if record else None for record in stored] == outputs
    assert outputs == solo_outputs(demo_engine, private_redis, specs)
