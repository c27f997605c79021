"""Shared prefixes: which prefix a prompt has (pure logic; eviction and partitions are in
tests/unit/test_prefix_table.py), and on the real engine that a prefix run as CTranslate2's
cached static prompt changes no greedy output, is a hit for every batch after the first, and
never for another API key's first.

The engine checks use float32 models (the demo model and the random Llama-style one): on this
CPU, int8 rounding already depends on how a prompt is split between prefill and the decoding
loop (a job batched beside a shorter prompt), so no batching change is bit-exact there.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import redis

from tests.scheduler_harness import Harness, solo_outputs
from trickle.config.sections import ModelSettings
from trickle.config.settings import ConfigError, settings_from_dict
from trickle.tokenization import load_tokenizer
from worker.engine.engine import Engine
from worker.engine.prefix import BOUNDARY_MARGIN, PrefixTable
from worker.engine.request import EngineRequest, SamplingKey

GREEDY = SamplingKey(1.0, 1, 1.0, 1.0, True)
SYSTEM = "You are a careful assistant. Answer briefly, and say so when unsure. " * 6


def ids(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_a_prompt_sharing_enough_leading_ids_with_a_recent_one_learns_their_common_part() -> None:
    table = PrefixTable((), max_entries=4, min_tokens=8)
    system = ids(20, 100)
    assert table.prefix_for([*system, 1, 2, 3]) == ()  # nothing to share with yet
    learned = table.prefix_for([*system, 1, 5, 6])
    # Their common part less the margin: the ids at its end may be shared by chance.
    assert learned == tuple([*system, 1][: 21 - BOUNDARY_MARGIN])
    assert table.prefix_for([*system, 7, 9]) == learned  # a hit: the known prefix
    # Past the first min_tokens ids only: too short a common part is no prefix.
    assert PrefixTable((), 4, 8).prefix_for(ids(7)) == ()


def test_a_prefix_always_leaves_the_engine_a_start_token() -> None:
    table = PrefixTable((), max_entries=4, min_tokens=4)
    prompt = ids(12)
    table.prefix_for(prompt)
    learned = table.prefix_for(prompt)  # the same prompt again: all of it but the margin
    assert learned == tuple(prompt[: 12 - BOUNDARY_MARGIN])
    assert table.prefix_for(list(learned)) != learned  # never a whole prompt


def test_the_prefix_knobs_are_validated_by_name(tmp_path: Path) -> None:
    for key, value in (
        ("prefix_cache_entries", -1),
        ("prefix_min_tokens", 0),
        ("prefix_cache_tokens", -1),
    ):
        table = {"path": str(tmp_path), key: value}
        with pytest.raises(ConfigError, match=re.escape(f"models.m.{key}")):
            settings_from_dict({"models": {"m": table}, "default_model": "m"})
    with pytest.raises(ConfigError, match=re.escape("models.m.tuning.rebalance_gain_ratio")):
        models = {"m": {"path": str(tmp_path), "tuning": {"rebalance_gain_ratio": -1}}}
        settings_from_dict({"models": models, "default_model": "m"})


def test_configured_static_prompts_are_encoded_as_prompts_are(demo_engine: Engine) -> None:
    model = ModelSettings(name="demo", path="", static_prompts=(SYSTEM,))
    table = PrefixTable.for_model(model, demo_engine.tokenizer)
    prompt = demo_engine.tokenizer.encode(SYSTEM + "\nUser: hello")
    (entry,) = table.entries()
    assert table.prefix_for(prompt) == entry
    assert tuple(prompt[: len(entry)]) == entry


def generated(engine: Engine, requests: list[EngineRequest]) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in requests]

    def on_step(position: int, step: int, token_id: int, logprob: float | None, last: bool) -> bool:
        out[position].append(token_id)
        return False

    engine.generate(requests, on_step)
    return out


@pytest.mark.parametrize("model", ["demo", "tiny-llama"])
def test_a_cached_static_prompt_changes_no_greedy_output(
    model: str, demo_engine: Engine, llama_engine: Engine
) -> None:
    engine = demo_engine if model == "demo" else llama_engine
    encode = engine.tokenizer.encode
    prompts = [encode(f"{SYSTEM}\nUser: {user}\nAssistant:") for user in ("Hi", "What is a socket")]
    table = PrefixTable((), max_entries=2, min_tokens=16)
    table.prefix_for(prompts[0])
    prefix = table.prefix_for(prompts[1])
    assert len(prefix) > 60 and all(tuple(p[: len(prefix)]) == prefix for p in prompts)
    plain = [EngineRequest(prompt, 40, GREEDY) for prompt in prompts]
    shared = [EngineRequest(prompt, 40, GREEDY, prefix=prefix) for prompt in prompts]
    assert not engine.prefix_cached(prefix)
    expected = generated(engine, plain)
    assert generated(engine, shared) == expected  # the first batch computes and caches it
    assert engine.prefix_cached(prefix)
    assert generated(engine, shared) == expected  # later ones start from the cached state
    assert generated(engine, shared[1:]) == expected[1:]
    with pytest.raises(ValueError, match="static prompt"):
        generated(engine, [plain[0], shared[1]])


def test_chats_sharing_a_system_prompt_batch_together_and_count_their_hits(
    llama_engine: Engine, private_redis: redis.Redis
) -> None:
    """Through the scheduler: the shared prefix is learned from the first two chats, every
    later one hits it, jobs of one prefix run as one batch, and outputs are the solo ones."""
    specs: list[dict[str, object]] = [
        # Its own system prompt: the engine fixture's cache may hold the other test's prefix.
        {"prompt": f"Be kind. {SYSTEM}\nUser: {user}\nAssistant:", "max_tokens": 30}
        for user in ("Hi", "What is a socket", "Name a prime", "Why", "Say more")
    ]
    for spec in specs:
        spec.update(ignore_eos=True, temperature=0.0)
    table = PrefixTable((), max_entries=4, min_tokens=32)
    harness = Harness(llama_engine, private_redis, 8, wait_ms=50, prefixes=table)
    try:
        first = harness.run([harness.job(**specs[0])])  # type: ignore[arg-type]
        second = harness.run([harness.job(**specs[1])])  # type: ignore[arg-type]
        rest = harness.run([harness.job(**spec) for spec in specs[2:]])  # type: ignore[arg-type]
    finally:
        harness.close()
    jobs = [*first, *second, *rest]
    assert [job.prefix_hit for job in jobs] == [None, False, True, True, True]
    assert list(harness.scheduler.batch_sizes)[-1] == 3  # one prefix, one batch
    assert [job.state.output for job in jobs] == solo_outputs(llama_engine, private_redis, specs)


def test_another_keys_chat_never_starts_from_a_keys_cached_prefix(
    llama_engine: Engine, private_redis: redis.Redis
) -> None:
    """Key A's chats learn and cache their system prompt; key B's chats with the same one
    find nothing of A's: B learns it from its own prompts, and B's first batch with it computes
    it (a miss, as timing would show) before B's next one hits."""
    specs: list[dict[str, object]] = [
        {"prompt": f"Be fair. {SYSTEM}\nUser: {user}\nAssistant:", "max_tokens": 12}
        for user in ("Hi", "What is a socket", "Name a prime") * 2  # the same chats from A, B
    ]
    for spec in specs:
        spec.update(ignore_eos=True, temperature=0.0)
    tenant_digests = ["digest-a"] * 3 + ["digest-b"] * 3
    table = PrefixTable((), max_entries=4, min_tokens=32)
    harness = Harness(llama_engine, private_redis, 8, wait_ms=50, prefixes=table)
    try:
        jobs = [
            harness.run([harness.job(tenant_digest=tenant_digest, **spec)])[0]  # type: ignore[arg-type]
            for tenant_digest, spec in zip(tenant_digests, specs, strict=True)
        ]
    finally:
        harness.close()
    assert [job.prefix_hit for job in jobs] == [None, False, True, None, False, True]
    a_prefix, b_prefix = jobs[2].request.prefix, jobs[5].request.prefix
    assert a_prefix == b_prefix  # the same ids, cached once by CTranslate2...
    assert jobs[2].request.cache_partition != jobs[5].request.cache_partition  # ...kept apart
    assert [job.state.output for job in jobs] == solo_outputs(llama_engine, private_redis, specs)


def test_an_idle_engine_recycles_to_free_what_the_table_evicted(demo_model_dir: Path) -> None:
    """CTranslate2 never drops a cached state: once the budget is spent, a new prefix runs
    computed per batch; when the table has evicted enough of what is held, the next batch that
    finds the engine idle starts a new engine process, and the new prefix is cached."""
    encode = load_tokenizer(ModelSettings(name="demo", path=str(demo_model_dir))).encode
    first, second = (
        encode(f"{opening} {SYSTEM}\nUser: hi") for opening in ("Be fair.", "Be kind.")
    )
    prefixes = [tuple(prompt[: len(prompt) - 8]) for prompt in (first, second)]
    budget = len(prefixes[0]) + len(prefixes[1]) - 1  # room for one of the two
    settings = ModelSettings(
        name="demo", path=str(demo_model_dir), device="cpu", prefix_cache_tokens=budget
    )
    engine = Engine(settings)
    try:
        runs = [
            [EngineRequest(prompt, 8, GREEDY, prefix=prefix, cache_partition="key:a")]
            for prompt, prefix in zip((first, second), prefixes, strict=True)
        ]
        expected = [generated(engine, [dataclasses.replace(r[0], prefix=())]) for r in runs]
        assert generated(engine, runs[0]) == expected[0]
        assert engine.prefix_cached(prefixes[0], "key:a")
        process = engine.process_id
        assert generated(engine, runs[1]) == expected[1]  # no room: computed, not cached
        assert not engine.prefix_cached(prefixes[1], "key:a")
        engine.forget_prefix(prefixes[0])  # the table evicted the first one
        assert generated(engine, runs[1]) == expected[1]  # still no room: a recycle is due
        assert engine.process_id == process
        assert generated(engine, runs[1]) == expected[1]  # idle: a new process, room again
        assert engine.process_id != process
        assert engine.prefix_cached(prefixes[1], "key:a")
        assert not engine.prefix_cached(prefixes[0], "key:a")
    finally:
        engine.close()
