"""The latency budget over the hops, on real processes: every answer says where its time went
(``Server-Timing``, a stream's last comment, the stored job), and the hops before the first
token add up to the job's time to first token."""

from __future__ import annotations

import json
import time

import requests

from tests.clients import read_sse, submit
from tests.metrics_text import scrape

FIRST_TOKEN_HOPS = ("admit", "queue", "claim", "prefill")
ALL_HOPS = (*FIRST_TOKEN_HOPS, "generate", "deliver")
BODY = {"prompt": "The", "max_tokens": 8, "ignore_eos": True}
MESSAGES = [{"role": "user", "content": "Hi"}]


def parse_server_timing(value: str) -> dict[str, float]:
    """W3C Server-Timing: ``name;dur=<ms>`` entries, comma-separated."""
    hops: dict[str, float] = {}
    for entry in value.split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        durations = [float(p.removeprefix("dur=")) for p in params if p.startswith("dur=")]
        assert len(durations) == 1, value
        hops[name] = durations[0]
    return hops


def assert_tiles(hops: dict[str, float], ttft_seconds: float) -> None:
    """The hops before the first token sum to the time to first token, within 2 ms."""
    assert all(hops[name] >= 0 for name in hops)
    assert abs(sum(hops[name] for name in FIRST_TOKEN_HOPS) - ttft_seconds * 1000) <= 2.0, hops


def test_a_waited_job_has_every_hop_in_its_header_and_record(stack_url: str) -> None:
    response = requests.post(
        f"{stack_url}/v1/jobs", json=BODY, headers={"Prefer": "wait=30"}, timeout=60
    )
    assert response.status_code == 200, response.text
    job = response.json()
    hops = parse_server_timing(response.headers["Server-Timing"])
    assert tuple(hops) == ALL_HOPS
    assert_tiles(hops, job["metrics"]["time_to_first_token_seconds"])
    assert tuple(job["timings"]) == ALL_HOPS[:-1]  # the record: no request delivered it yet
    for name in FIRST_TOKEN_HOPS:
        assert abs(job["timings"][name] - hops[name]) <= 0.001
    # A later poll did not deliver the answer: the stored hops only.
    later = requests.get(f"{stack_url}/v1/jobs/{job['id']}", timeout=30)
    assert tuple(parse_server_timing(later.headers["Server-Timing"])) == ALL_HOPS[:-1]


def test_a_native_stream_ends_with_the_hops(stack_url: str) -> None:
    job = submit(stack_url, BODY)
    done = read_sse(stack_url, job["id"]).done
    assert done is not None
    final = done  # the finished job
    assert tuple(final["timings"]) == ALL_HOPS[:-1]
    assert_tiles(final["timings"], final["metrics"]["time_to_first_token_seconds"])


def test_openai_answers_carry_server_timing(stack_url: str) -> None:
    chat = {"model": "demo", "messages": MESSAGES, "max_tokens": 8}
    response = requests.post(f"{stack_url}/v1/chat/completions", json=chat, timeout=60)
    assert response.status_code == 200, response.text
    assert tuple(parse_server_timing(response.headers["Server-Timing"])) == ALL_HOPS
    completion = {"model": "demo", "prompt": "The", "max_tokens": 8, "n": 2}
    response = requests.post(f"{stack_url}/v1/completions", json=completion, timeout=60)
    assert response.status_code == 200, response.text
    assert tuple(parse_server_timing(response.headers["Server-Timing"])) == ALL_HOPS


def comments_and_events(response: requests.Response) -> tuple[list[str], list[str]]:
    comments: list[str] = []
    lines: list[str] = []
    for raw in response.iter_lines(decode_unicode=True):
        if raw.startswith(":"):
            comments.append(raw[1:].strip())
        elif raw:
            lines.append(raw)
    return comments, lines


def test_openai_stream_gives_its_hops_in_a_comment_before_done(stack_url: str) -> None:
    chat = {"model": "demo", "messages": MESSAGES, "max_tokens": 8, "stream": True}
    with requests.post(
        f"{stack_url}/v1/chat/completions", json=chat, stream=True, timeout=60
    ) as response:
        assert "Server-Timing" not in response.headers  # sent before any hop ended
        comments, lines = comments_and_events(response)
    assert lines[-1] == "data: [DONE]"
    timing = [c.removeprefix("server-timing ") for c in comments if c.startswith("server-timing")]
    assert len(timing) == 1
    assert tuple(parse_server_timing(timing[0])) == ALL_HOPS


def test_anthropic_and_responses_answers_carry_server_timing(stack_url: str) -> None:
    message = {"model": "demo", "max_tokens": 8, "messages": MESSAGES}
    response = requests.post(f"{stack_url}/v1/messages", json=message, timeout=60)
    assert response.status_code == 200, response.text
    assert tuple(parse_server_timing(response.headers["Server-Timing"])) == ALL_HOPS
    with requests.post(
        f"{stack_url}/v1/messages", json={**message, "stream": True}, stream=True, timeout=60
    ) as streamed:
        comments, lines = comments_and_events(streamed)
    assert lines[-1].startswith("data: ") and json.loads(lines[-1][6:])["type"] == "message_stop"
    assert any(c.startswith("server-timing admit;dur=") for c in comments)
    created = {"model": "demo", "input": "Hi", "max_output_tokens": 8}
    response = requests.post(f"{stack_url}/v1/responses", json=created, timeout=60)
    assert response.status_code == 200, response.text
    assert tuple(parse_server_timing(response.headers["Server-Timing"])) == ALL_HOPS


def test_metrics_have_one_histogram_over_the_hops(stack_url: str) -> None:
    submit(stack_url, BODY, wait=30)
    wanted = [f'trickle_hop_seconds_count{{hop="{hop}",model="demo"}}' for hop in ALL_HOPS[:-1]]
    deadline = time.monotonic() + 15  # workers flush their metrics every few seconds
    samples = scrape(stack_url)
    while not all(name in samples for name in wanted) and time.monotonic() < deadline:
        time.sleep(0.25)
        samples = scrape(stack_url)
    assert all(samples.get(name, 0) >= 1 for name in wanted), sorted(samples)
    hops = {
        name.partition('hop="')[2].partition('"')[0] for name in samples if "hop_seconds" in name
    }
    assert hops <= set(ALL_HOPS)  # a bounded label set
