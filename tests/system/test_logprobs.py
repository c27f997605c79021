"""Real log probabilities: each token's alternatives, from its step's logits, on every route.

The official client against the real stack and ``served_model`` (demo, or SmolLM2 under `make
test-real-model`). The chosen token's entry must be the alternative it was drawn from: greedy,
it is the first, with the same log-probability.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import openai
import pytest
import requests


@pytest.fixture(scope="module")
def client(stack_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack_url}/v1", api_key="unused", max_retries=0)


CHAT = {
    "model": "demo",
    "messages": [{"role": "user", "content": "The socket module"}],
    "max_tokens": 12,
    "temperature": 0,
    "logprobs": True,
    "top_logprobs": 5,
    "extra_body": {"ignore_eos": True},
}


@pytest.fixture(scope="module")
def chat(served_model: str) -> dict[str, Any]:
    return {**CHAT, "model": served_model}


@pytest.mark.both_models
def test_chat_reports_the_alternatives_of_each_token(
    client: openai.OpenAI, chat: dict[str, Any]
) -> None:
    result = client.chat.completions.create(**chat)  # type: ignore[call-overload]
    content = result.choices[0].logprobs.content
    assert len(content) == 12
    assert "".join(item.token for item in content) == result.choices[0].message.content
    for item in content:
        values = [alt.logprob for alt in item.top_logprobs]
        assert len(values) == 5
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-6
        assert len({alt.token for alt in item.top_logprobs}) == 5
        # Greedy: the chosen token is the most likely one, with its very log-probability.
        assert item.logprob == pytest.approx(values[0], abs=1e-5)
        assert item.top_logprobs[0].token == item.token


@pytest.mark.both_models
def test_a_streamed_chat_carries_the_same_alternatives(
    client: openai.OpenAI, chat: dict[str, Any]
) -> None:
    whole = client.chat.completions.create(**chat)  # type: ignore[call-overload]
    chunks = list(client.chat.completions.create(stream=True, **chat))  # type: ignore[call-overload]
    streamed = [
        item
        for chunk in chunks
        if chunk.choices and chunk.choices[0].logprobs
        for item in chunk.choices[0].logprobs.content or ()
    ]
    expected = whole.choices[0].logprobs.content
    assert [(i.token, i.logprob) for i in streamed] == [(i.token, i.logprob) for i in expected]
    assert [[a.token for a in i.top_logprobs] for i in streamed] == [
        [a.token for a in i.top_logprobs] for i in expected
    ]


@pytest.mark.both_models
def test_a_sampled_token_matches_the_alternative_it_was_drawn_from(
    client: openai.OpenAI, chat: dict[str, Any]
) -> None:
    result = client.chat.completions.create(  # type: ignore[call-overload]
        **{**chat, "temperature": 0.8, "top_logprobs": 20, "max_tokens": 30}
    )
    content = result.choices[0].logprobs.content
    matched = 0
    for item in content:
        same = [alt for alt in item.top_logprobs if alt.token == item.token]
        if same:  # a token outside the 20 most likely has no alternative entry
            assert same[0].logprob == pytest.approx(item.logprob, abs=1e-5)
            matched += 1
        assert item.logprob <= item.top_logprobs[0].logprob + 1e-6
    assert matched >= len(content) // 2


@pytest.mark.both_models
def test_completions_report_up_to_five_alternatives(
    client: openai.OpenAI, served_model: str
) -> None:
    result = client.completions.create(
        model=served_model,
        prompt="The socket module",
        max_tokens=8,
        temperature=0,
        logprobs=3,
        extra_body={"ignore_eos": True},
    )
    logprobs = result.choices[0].logprobs
    assert logprobs is not None and logprobs.top_logprobs is not None
    assert logprobs.token_logprobs is not None
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert len(top) == 3
        assert chosen == pytest.approx(max(top.values()), abs=1e-5)
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=served_model, prompt="x", logprobs=6)
    assert refused.value.body["param"] == "logprobs"  # type: ignore[index]


@pytest.mark.both_models
def test_responses_report_alternatives_in_the_output_text(
    client: openai.OpenAI, served_model: str
) -> None:
    response = client.responses.create(
        model=served_model,
        input="The socket module",
        max_output_tokens=8,
        temperature=0,
        include=["message.output_text.logprobs"],
        top_logprobs=4,
        extra_body={"ignore_eos": True},
    )
    part = response.output[0].content[0]
    assert len(part.logprobs) == 8  # type: ignore[union-attr]
    for entry in part.logprobs:  # type: ignore[union-attr]
        assert len(entry.top_logprobs) == 4
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-5)


def test_a_big_answer_is_written_in_pieces_while_the_process_serves(stack_url: str) -> None:
    """The probe: ``n=8`` with ``top_logprobs`` 20 made a 22 MiB body rendered in one go,
    ``/healthz`` stalled about 2 s. The body now arrives in pieces (chunked, no length), every
    choice whole, and the process answers its probe meanwhile."""
    body: dict[str, Any] = {
        "model": "demo", "messages": [{"role": "user", "content": "The socket module"}],
        "max_tokens": 256, "n": 8, "logprobs": True, "top_logprobs": 20, "ignore_eos": True,
    }  # fmt: skip
    probes: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            start = time.monotonic()
            requests.get(f"{stack_url}/healthz", timeout=10)
            probes.append(time.monotonic() - start)
            time.sleep(0.01)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        answer = requests.post(f"{stack_url}/v1/chat/completions", json=body, timeout=120)
    finally:
        done.set()
        prober.join()
    assert answer.status_code == 200
    assert "Content-Length" not in answer.headers  # streamed, not one string
    choices = answer.json()["choices"]
    assert len(choices) == 8
    for choice in choices:
        content = choice["logprobs"]["content"]
        assert len(content) == 256 and all(len(x["top_logprobs"]) == 20 for x in content)
        assert "".join(x["token"] for x in content) == choice["message"]["content"]
    assert probes and max(probes) < 1.0, max(probes)
