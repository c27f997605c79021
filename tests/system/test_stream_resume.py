"""A streamed OpenAI request with an Idempotency-Key survives its client: the retry of a dropped
stream re-attaches (replays from the first token, follows to the end), and a request whose jobs
ended canceled answers its retry with an error, never a cut stream reported complete. On a real
stack: Redis, gunicorn, a Celery worker, a model slow enough to outlast the grace.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.clients import get_job, poll_until_finished
from tests.faultstack import FaultStack, build_fault_stack, build_slow_model, wait_for

GRACE = 2.0
HEADER = "Idempotency-Key"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[FaultStack]:
    root = tmp_path_factory.mktemp("stream-resume")
    slow = build_slow_model(root, demo_model_dir / "tokenizer.model")
    stack = build_fault_stack(
        root,
        models_toml=(
            f'[models.demo]\npath = "{demo_model_dir}"\n'
            f'[models.slow]\npath = "{slow}"\nmax_batch_size = 4\nintra_threads = 1\n'
        ),
        settings_toml=(
            f"[web]\nstream_resume_grace_seconds = {GRACE}\n[limits]\nmax_tokens_ceiling = 2000\n"
        ),
    )
    stack.worker("runner", ("demo", "slow"))
    yield stack
    stack.close()


def chat(max_tokens: int) -> dict[str, Any]:
    return {
        "model": "slow",
        "messages": [{"role": "user", "content": "Tell me everything"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }


def open_stream(base: str, body: dict[str, Any], key: str) -> requests.Response:
    return requests.post(
        f"{base}/v1/chat/completions", json=body, headers={HEADER: key}, stream=True, timeout=60
    )


def events(response: requests.Response) -> Iterator[Any]:
    """Each ``data:`` payload: a parsed chunk, or the string ``[DONE]``."""
    for line in response.iter_lines():
        if line.startswith(b"data: "):
            payload = line[len(b"data: ") :]
            yield payload.decode() if payload == b"[DONE]" else json.loads(payload)


def drop_after_content(base: str, body: dict[str, Any], key: str, chunks: int) -> tuple[str, str]:
    """Read ``chunks`` content chunks of a keyed stream, then drop the connection; returns the
    job id and the text read."""
    text = ""
    with open_stream(base, body, key) as response:
        assert response.status_code == 200, response.text
        seen = 0
        for event in events(response):
            job_id = event["id"]
            content = event["choices"][0]["delta"].get("content")
            if content:
                text += content
                seen += 1
                if seen == chunks:
                    break
    return job_id, text


def test_a_retry_within_the_grace_replays_the_whole_stream(held: FaultStack) -> None:
    key = f"resume-{uuid.uuid4()}"
    body = chat(600)
    job_id, first_text = drop_after_content(held.web_url, body, key, 3)
    with open_stream(held.web_url, body, key) as retry:
        assert retry.status_code == 200, retry.text
        received = list(events(retry))
    assert received[-1] == "[DONE]"
    chunks = received[:-1]
    assert {chunk["id"] for chunk in chunks} == {job_id}  # the first request's job, re-attached
    text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks)
    reasons = [chunk["choices"][0]["finish_reason"] for chunk in chunks]
    assert reasons[-1] == "length" and set(reasons[:-1]) == {None}
    final = poll_until_finished(held.web_url, job_id, timeout=60)
    assert final["status"] == "succeeded"
    assert final["usage"]["completion_tokens"] == 600
    # From the first token: the whole stream equals the stored output, the dropped part included.
    assert text == final["output"] and text.startswith(first_text)


def test_a_request_whose_grace_ran_out_answers_its_retry_409(held: FaultStack) -> None:
    key = f"expired-{uuid.uuid4()}"
    body = chat(1500)
    job_id, _ = drop_after_content(held.web_url, body, key, 3)
    dropped = time.monotonic()
    time.sleep(GRACE / 4)
    assert get_job(held.web_url, job_id)["status"] == "running"  # held, not canceled at once
    final = poll_until_finished(held.web_url, job_id, timeout=GRACE + 30)
    assert final["status"] == "canceled"
    assert time.monotonic() - dropped >= GRACE - 0.1
    assert final["usage"]["completion_tokens"] < 1500
    with open_stream(held.web_url, body, key) as retry:
        assert retry.status_code == 409, retry.text
        error = retry.json()["error"]
    assert error["code"] == "request_canceled" and error["param"] == HEADER
    assert job_id in error["message"]


def test_a_canceled_job_ends_its_stream_with_an_error_and_its_retry_409(held: FaultStack) -> None:
    key = f"canceled-{uuid.uuid4()}"
    body = chat(1500)
    with open_stream(held.web_url, body, key) as response:
        received = []
        for event in events(response):
            received.append(event)
            if len(received) == 3:
                job_id = event["id"]
                canceled = requests.post(f"{held.web_url}/v1/jobs/{job_id}/cancel", timeout=10)
                assert canceled.status_code in (200, 202), canceled.text
    assert "[DONE]" not in received
    last = received[-1]
    assert last["error"]["code"] == "request_canceled", last
    reasons = {chunk["choices"][0]["finish_reason"] for chunk in received[:-1]}
    assert reasons == {None}  # no chunk claims the answer finished
    wait_for(lambda: get_job(held.web_url, job_id)["status"] == "canceled", 10, "the cancel")
    retry = requests.post(
        f"{held.web_url}/v1/chat/completions", json=body, headers={HEADER: key}, timeout=30
    )
    assert retry.status_code == 409 and retry.json()["error"]["code"] == "request_canceled"


def test_a_responses_stream_retried_within_the_grace_replays_every_event(held: FaultStack) -> None:
    key = f"responses-{uuid.uuid4()}"
    body = {
        "model": "slow",
        "input": "Tell me everything",
        "max_output_tokens": 400,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    url = f"{held.web_url}/v1/responses"
    with requests.post(url, json=body, headers={HEADER: key}, stream=True, timeout=60) as first:
        seen = [e for _, e in zip(range(6), events(first), strict=False)]
    response_id = seen[0]["response"]["id"]
    with requests.post(url, json=body, headers={HEADER: key}, stream=True, timeout=60) as retry:
        assert retry.status_code == 200, retry.text
        replayed = list(events(retry))
    assert [e["sequence_number"] for e in replayed] == list(range(len(replayed)))  # from 0
    assert replayed[:6] == seen
    last = replayed[-1]
    assert last["type"] == "response.incomplete" and last["response"]["id"] == response_id
    text = "".join(e["delta"] for e in replayed if e["type"] == "response.output_text.delta")
    stored = requests.get(f"{url}/{response_id}", timeout=10).json()
    assert stored["status"] == "incomplete"  # max_output_tokens reached, not cancelled
    assert text == stored["output"][0]["content"][0]["text"]
