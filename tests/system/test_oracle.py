"""Output against an oracle: CTranslate2 and SentencePiece run here, in the test process.

"Streamed equals stored" cannot catch a detokenizer (or a sampling option) that is wrong in both
places. So for greedy jobs the test computes the ids itself (same model, greedy, same options)
and decodes all of them, prompt included, with SentencePiece; the streamed text and the stored
output must both equal that decode minus the prompt's. tests/scripted_model.py scripts output
full of multi-byte characters split into byte-fallback pieces; the random-weight Llama-style
model emits ids from the whole vocabulary, byte-fallback pieces (some forming no valid
UTF-8) included.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ctranslate2
import pytest
import requests
import sentencepiece as spm

from tests.clients import read_sse, submit
from tests.metrics_text import parse_samples
from tests.scripted_model import PROMPT, cycle_ids
from worker.engine.model_hints import resolve_compute_type


class Oracle:
    def __init__(self, model_dir: Path):
        self.sp = spm.SentencePieceProcessor(model_file=str(model_dir / "tokenizer.model"))
        # The compute type the server resolves for this model (its configs leave it at auto).
        compute_type = resolve_compute_type(model_dir, "auto")
        self.generator = ctranslate2.Generator(
            str(model_dir), device="cpu", intra_threads=1, compute_type=compute_type
        )

    def ids(self, prompt: str, max_tokens: int, repetition_penalty: float = 1.0) -> list[int]:
        prompt_ids = [self.sp.bos_id(), *self.sp.encode(prompt)]
        (result,) = self.generator.generate_batch(
            [[self.sp.id_to_piece(i) for i in prompt_ids]],
            max_length=max_tokens,
            sampling_topk=1,
            repetition_penalty=repetition_penalty,
            include_prompt_in_result=False,
            end_token=[],
        )
        return list(result.sequences_ids[0])

    def text(self, prompt: str, generated: list[int]) -> str:
        """SentencePiece's own decode of every id, less the prompt's decode."""
        prompt_ids = [self.sp.bos_id(), *self.sp.encode(prompt)]
        whole: str = self.sp.decode(prompt_ids + generated)
        head: str = self.sp.decode(prompt_ids)
        assert whole.startswith(head)
        return whole[len(head) :]

    def byte_pieces(self, ids: list[int]) -> int:
        return sum(1 for i in ids if self.sp.is_byte(i))

    def close(self) -> None:
        self.generator.unload_model()


@pytest.fixture(scope="module")
def demo(demo_model_dir: Path) -> Any:
    oracle = Oracle(demo_model_dir)
    yield oracle
    oracle.close()


@pytest.fixture(scope="module")
def scripted(scripted_model_dir: Path) -> Any:
    oracle = Oracle(scripted_model_dir)
    yield oracle
    oracle.close()


@pytest.fixture(scope="module")
def llama(llama_model_dir: Path) -> Any:
    oracle = Oracle(llama_model_dir)
    yield oracle
    oracle.close()


def greedy(prompt: str, model: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }


def streamed_and_stored(base: str, body: dict[str, Any]) -> tuple[str, str]:
    job = submit(base, body)
    stream = read_sse(base, job["id"], timeout=120)
    assert stream.done is not None and stream.done["status"] == "succeeded", stream.done
    assert stream.indexes == list(range(body["max_tokens"]))
    return stream.text, stream.done["output"]


@pytest.mark.parametrize(
    "prompt",
    ["The socket module", "Naïve café ☃ 日本語 🎉"],
    ids=["ascii", "utf8"],
)
def test_long_greedy_output_equals_sentencepiece_decode(
    stack_url: str, demo: Oracle, prompt: str
) -> None:
    expected = demo.text(prompt, demo.ids(prompt, 400))
    streamed, stored = streamed_and_stored(stack_url, greedy(prompt, "demo", 400))
    assert streamed == expected
    assert stored == expected


@pytest.mark.parametrize("max_tokens", [300, 313])  # both end inside a multi-byte character
def test_multibyte_and_byte_fallback_output_equals_sentencepiece_decode(
    stack_url: str, scripted: Oracle, max_tokens: int
) -> None:
    ids = scripted.ids(PROMPT, max_tokens)
    assert set(ids) == set(cycle_ids(scripted.sp))  # the script ran, every piece of it
    expected = scripted.text(PROMPT, ids)
    assert all(char in expected for char in "ï日☃🎉ж\ufffd")
    streamed, stored = streamed_and_stored(stack_url, greedy(PROMPT, "scripted", max_tokens))
    assert streamed == expected
    assert stored == expected


def test_random_vocabulary_with_byte_fallback_equals_sentencepiece_decode(
    stack_url: str, llama: Oracle
) -> None:
    prompt = "héllo 🎉"
    ids = llama.ids(prompt, 300)
    assert llama.byte_pieces(ids) >= 10, "the oracle's output should exercise byte fallback"
    expected = llama.text(prompt, ids)
    streamed, stored = streamed_and_stored(stack_url, greedy(prompt, "tiny-llama", 300))
    assert streamed == expected
    assert stored == expected


def test_repetition_penalty_changes_greedy_output_alone_and_in_a_batch(
    stack_url: str, demo: Oracle
) -> None:
    prompt, penalty = "The value", 1.5
    plain = demo.text(prompt, demo.ids(prompt, 60))
    penalised = demo.text(prompt, demo.ids(prompt, 60, repetition_penalty=penalty))
    assert plain != penalised  # the oracle itself proves the option matters here
    body = greedy(prompt, "demo", 60, repetition_penalty=penalty)
    assert streamed_and_stored(stack_url, body) == (penalised, penalised)
    # Several at once share generate_batch calls: each still gets its own penalty, and jobs
    # with different penalties never share one call.
    bodies = [body, greedy(prompt, "demo", 60)] * 3
    with ThreadPoolExecutor(max_workers=6) as pool:
        batched = list(pool.map(lambda b: streamed_and_stored(stack_url, b), bodies))
    assert batched == [(penalised, penalised), (plain, plain)] * 3


def test_repetition_penalty_changes_seeded_output(stack_url: str) -> None:
    # Seeded jobs run alone on a Generator of their own: the penalty applies there too.
    body = {"prompt": "The value", "max_tokens": 40, "ignore_eos": True, "seed": 7, "top_k": 3}
    plain = submit(stack_url, body, wait=60)
    penalised = submit(stack_url, {**body, "repetition_penalty": 3.0}, wait=60)
    again = submit(stack_url, {**body, "repetition_penalty": 3.0}, wait=60)
    assert plain["status"] == penalised["status"] == again["status"] == "succeeded"
    assert penalised["output"] == again["output"]  # still repeatable
    assert penalised["output"] != plain["output"]


def test_stop_strings_cut_the_oracle_text_and_are_never_streamed(
    stack_url: str, demo: Oracle
) -> None:
    prompt = "The socket module"
    full = demo.text(prompt, demo.ids(prompt, 200))
    # A stop that starts inside one token and ends in another, listed after one that never
    # occurs: hold-back must consider both.
    start = len(full) // 2
    stop = full[start + 1 : start + 7]
    expected = full[: full.find(stop)]
    body = greedy(prompt, "demo", 200, stop=["\x00never", stop])
    job = submit(stack_url, body)
    stream = read_sse(stack_url, job["id"], timeout=120)
    assert stream.done is not None and stream.done["finish_reason"] == "stop"
    assert stream.text == expected
    assert stream.done["output"] == expected
    # No streamed prefix ever held a piece of the stop beyond what the final text keeps.
    streamed = ""
    for token in stream.tokens:
        streamed += token["text"]
        assert expected.startswith(streamed)


def running_jobs(base: str) -> float:
    samples = parse_samples(requests.get(f"{base}/metrics", timeout=10).text)
    return samples.get("trickle_running_jobs", 0.0)


def restart_counts(base: str, model: str) -> dict[str, float]:
    samples = parse_samples(requests.get(f"{base}/metrics", timeout=10).text)
    return {
        kind: samples.get(f'trickle_engine_restarts_total{{kind="{kind}",model="{model}"}}', 0.0)
        for kind in ("join", "split")
    }


@pytest.mark.timeout(180)  # up to six tries of a burst
@pytest.mark.parametrize(
    ("model", "jobs", "max_tokens"), [("demo", 8, 1000), ("tiny-llama", 4, 400)]
)
def test_greedy_output_survives_a_rebalance_between_lanes(
    stack_url: str, demo: Oracle, llama: Oracle, model: str, jobs: int, max_tokens: int
) -> None:
    """A job no other can join (a repetition penalty) holds one lane while greedy jobs land on
    the other; when it ends, the free lane takes half of them if that is worth its catch-up (a
    split: the batch restarts as two). Every output equals the oracle's, streamed and stored
    alike, split or not; the demo model's long batch is always worth splitting."""
    oracle = demo if model == "demo" else llama
    blocker = greedy("The value", model, 150, repetition_penalty=1.5)
    texts = ["The socket module", "héllo 🎉", "Return the", "A list of values", "If", "This"]
    prompts = [texts[i % len(texts)] + " " * (i // len(texts)) for i in range(jobs)]
    expected = [oracle.text(prompt, oracle.ids(prompt, max_tokens)) for prompt in prompts]
    split = False
    for _attempt in range(6):  # the split needs the burst to land while the blocker runs
        # Earlier tests' jobs still running would hold the lanes the blocker and burst need.
        assert wait_until(lambda: running_jobs(stack_url) == 0, 60), "the worker stayed busy"
        before = restart_counts(stack_url, model)["split"]
        with ThreadPoolExecutor(max_workers=jobs + 1) as pool:
            held = pool.submit(streamed_and_stored, stack_url, blocker)
            time.sleep(0.05)
            bodies = [greedy(prompt, model, max_tokens) for prompt in prompts]
            results = list(pool.map(lambda body: streamed_and_stored(stack_url, body), bodies))
            held.result()
        assert results == [(text, text) for text in expected]
        if wait_until(lambda: restart_counts(stack_url, model)["split"] > before):  # noqa: B023
            split = True
            break
    assert split or model != "demo", "no split in six tries: the free lane stayed idle"


def test_a_shared_system_prompt_is_cached_and_changes_no_greedy_output(
    stack_url: str, llama: Oracle
) -> None:
    """Chats that start with one system prompt: the second teaches the worker their common
    prefix, later ones start from CTranslate2's cached state (counted as hits), and every
    output equals the oracle's uncached run."""
    system = "System: You are terse. Answer in one line, and never repeat the question. " * 3
    users = ["What is a socket?", "Name a colour.", "Why is the sky blue?", "Say hello."]
    prompts = [f"{system}\nUser: {user}\nAssistant:" for user in users]
    assert len(llama.sp.encode(system)) > 64  # past prefix_min_tokens
    hits = "trickle_prefix_cache_hits_total"

    def hit_count() -> float:
        samples = parse_samples(requests.get(f"{stack_url}/metrics", timeout=10).text)
        return samples.get(f'{hits}{{model="tiny-llama"}}', 0.0)

    before = hit_count()
    for prompt in prompts:
        expected = llama.text(prompt, llama.ids(prompt, 40))
        assert streamed_and_stored(stack_url, greedy(prompt, "tiny-llama", 40)) == (
            expected,
            expected,
        )
    assert wait_until(lambda: hit_count() >= before + 2), "the later chats were no cache hits"


def wait_until(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False
