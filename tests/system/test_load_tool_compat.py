"""What load tools (GuideLLM, ``vllm bench serve``) send works unchanged: vLLM's sampling extras
as top-level fields, ``stream_options.continuous_usage_stats``, and ``/health``."""

from __future__ import annotations

import json

import pytest
import requests

from tests.clients import submit
from tests.scripted_model import ENDING_PROMPT


def stream_chunks(base: str, path: str, body: dict[str, object]) -> list[dict[str, object]]:
    chunks = []
    with requests.post(f"{base}{path}", json=body, stream=True, timeout=60) as response:
        assert response.status_code == 200, response.text
        for line in response.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def test_health_answers_like_vllm_and_tgi(stack_url: str) -> None:
    assert requests.get(f"{stack_url}/health", timeout=10).status_code == 200


def test_continuous_usage_stats_puts_usage_so_far_in_every_chunk(stack_url: str) -> None:
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    chunks = stream_chunks(stack_url, "/v1/chat/completions", body)
    with_choices = [chunk for chunk in chunks if chunk["choices"]]
    counted = [chunk["usage"]["completion_tokens"] for chunk in with_choices if "usage" in chunk]  # type: ignore[index]
    # One chunk per token (after the role chunk) carries the running count, then the last one 12.
    assert counted[-12:] == list(range(1, 13)) or counted[-13:] == [*range(1, 13), 12]
    final = chunks[-1]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 12  # type: ignore[index]
    prompt_tokens = {chunk["usage"]["prompt_tokens"] for chunk in with_choices if "usage" in chunk}  # type: ignore[index]
    assert len(prompt_tokens) == 1 and prompt_tokens.pop() > 0


@pytest.mark.parametrize("seed", [None, 7], ids=["batched", "seeded"])
def test_min_tokens_holds_the_end_token_back(stack_url: str, seed: int | None) -> None:
    # The scripted model ends at once after "end"; a seeded job runs on a Generator of its
    # own, which must hold the end back too (top_k=1 keeps both greedy-equivalent).
    body = {
        "model": "scripted",
        "prompt": ENDING_PROMPT,
        "max_tokens": 20,
        "top_k": 1,
        "seed": seed,
    }
    if seed is not None:
        body["temperature"] = 1.0
    alone = submit(stack_url, body, wait=30)
    assert (alone["finish_reason"], alone["output"]) == ("stop", "")  # only the end token
    assert alone["usage"]["completion_tokens"] <= 1
    held = submit(stack_url, {**body, "min_tokens": 6}, wait=30)
    assert held["status"] == "succeeded"
    assert held["usage"]["completion_tokens"] >= 6 and held["output"]
    assert held["params"]["min_tokens"] == 6


def test_vllm_extras_are_top_level_fields_of_openai_requests(stack_url: str) -> None:
    body = {
        "model": "demo",
        "prompt": "The",
        "max_tokens": 8,
        "ignore_eos": True,
        "top_k": 1,
        "min_tokens": 8,
        "repetition_penalty": 1.0,
    }
    response = requests.post(f"{stack_url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 8


def test_min_tokens_above_max_tokens_is_refused_by_name(stack_url: str) -> None:
    body = {"prompt": "x", "max_tokens": 4, "min_tokens": 5}
    response = requests.post(f"{stack_url}/v1/jobs", json=body, timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "min_tokens"
