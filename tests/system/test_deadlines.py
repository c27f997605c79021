"""Deadlines on real processes: ``Cancel-After`` (a duration, on every job-creating route) and a
native job's ``deadline``. A job not started by then is not run (``expired``, its readers told
why); one running then is stopped with what it made (``finish_reason: deadline``)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests

from tests.clients import read_sse, submit

LONG = {"prompt": "The", "max_tokens": 1024, "ignore_eos": True}
MESSAGES = [{"role": "user", "content": "Hi"}]
ROUTES = {
    "/v1/jobs": {"prompt": "The", "max_tokens": 4},
    "/v1/completions": {"model": "demo", "prompt": "The", "max_tokens": 4},
    "/v1/chat/completions": {"model": "demo", "messages": MESSAGES, "max_tokens": 4},
    "/v1/responses": {"model": "demo", "input": "Hi", "max_output_tokens": 4},
    "/v1/messages": {"model": "demo", "messages": MESSAGES, "max_tokens": 4},
}


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("value", ["soon", "30", "-1s", "0s", "1x", "1m30", "9000h"])
def test_a_malformed_cancel_after_is_a_400_naming_it(
    stack_url: str, route: str, value: str
) -> None:
    response = requests.post(
        f"{stack_url}{route}", json=ROUTES[route], headers={"Cancel-After": value}, timeout=30
    )
    assert response.status_code == 400, response.text
    assert "Cancel-After" in response.text


@pytest.mark.parametrize("deadline", ["soon", -5, 0, True, 1.0])
def test_a_malformed_or_past_deadline_is_a_400_naming_it(stack_url: str, deadline: object) -> None:
    body = {**ROUTES["/v1/jobs"], "deadline": deadline}
    response = requests.post(f"{stack_url}/v1/jobs", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "deadline"


def test_a_job_not_started_by_its_deadline_is_not_run(stack_url: str) -> None:
    # One microsecond: no worker can claim it in time, so it must end expired, unrun.
    response = requests.post(
        f"{stack_url}/v1/jobs",
        json=LONG,
        headers={"Cancel-After": "1us", "Prefer": "wait=30"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    job = response.json()
    assert job["status"] == "expired"
    assert job["finish_reason"] == "deadline"
    assert job["output"] == "" and job["usage"]["completion_tokens"] == 0
    assert job["error"]["type"] == "deadline_exceeded"
    assert "deadline" in job["error"]["message"]
    assert job["deadline"] <= job["created_at"] + 1e-3
    # A reader that comes later is told the same, in the stream's done event.
    done = read_sse(stack_url, job["id"]).done
    assert done is not None and done["status"] == "expired"
    assert done["error"]["type"] == "deadline_exceeded"


def test_an_expired_openai_and_anthropic_request_is_an_error_naming_the_deadline(
    stack_url: str,
) -> None:
    for route in ("/v1/chat/completions", "/v1/messages"):
        response = requests.post(
            f"{stack_url}{route}", json=ROUTES[route], headers={"Cancel-After": "1us"}, timeout=60
        )
        assert response.status_code == 504, response.text
        assert "deadline" in response.text
    body = {**ROUTES["/v1/chat/completions"], "stream": True}
    with requests.post(
        f"{stack_url}/v1/chat/completions",
        json=body,
        headers={"Cancel-After": "1us"},
        stream=True,
        timeout=60,
    ) as response:
        text = response.text
    assert "deadline_exceeded" in text


def test_a_running_job_is_stopped_at_its_deadline_with_what_it_made(stack_url: str) -> None:
    # A deadline a little after its start: a loaded machine may claim it later than that (it
    # expires unrun, as above), so the margin grows until one is claimed in time.
    job: dict[str, Any] = {}
    for margin in (0.05, 0.1, 0.2, 0.4):
        job = submit(stack_url, {**LONG, "deadline": time.time() + margin}, wait=30)
        if job["status"] != "expired":
            break
    assert job["status"] == "succeeded", job
    assert job["finish_reason"] == "deadline"
    made = job["usage"]["completion_tokens"]
    assert 0 < made < LONG["max_tokens"]
    assert len(job["output"]) > 0
    assert job["completed_at"] - job["deadline"] < 1.0  # stopped at once, not run to the end


def test_cancel_after_takes_go_durations(stack_url: str) -> None:
    response = requests.post(
        f"{stack_url}/v1/jobs",
        json=ROUTES["/v1/jobs"],
        headers={"Cancel-After": "1m30.5s", "Prefer": "wait=30"},
        timeout=60,
    )
    job = response.json()
    assert job["status"] == "succeeded"
    assert abs(job["deadline"] - job["created_at"] - 90.5) < 0.5
