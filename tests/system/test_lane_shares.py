"""Jobs that run alone count as the lanes they hold: one key's streamed constrained chats (each
a batch of its own) leave another key's short stream the reserve lane, so its first token comes
about as soon as it does behind the same key's plain flood. The audit's probe, on two plain keys
of one worker with one lane of 4 slots and a reserve lane (worker/engine/fair_share.py); before
the fix the key's second constrained chat took the reserve lane too, and the other key's stream
waited for one of them to end."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.clients import read_sse
from tests.faultstack import FaultStack, plain_key_stack, wait_for
from tests.system.test_plain_keys import SMALL_MODEL
from tests.system.test_tenants import statuses
from trickle import keys

pytestmark = pytest.mark.timeout(240)
ALPHA, BRAVO = "alpha-lanes-secret", "bravo-lanes-secret"
LONG = 2048  # far more than either phase lets run: A's jobs are canceled once B has spoken
# A string longer than the budget: the grammar never closes it, every job runs its whole budget.
SCHEMA = {
    "type": "object",
    "properties": {"s": {"type": "string", "pattern": "^[a-z ]{3000}$"}},
    "required": ["s"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[FaultStack]:
    root = tmp_path_factory.mktemp("lanes")
    stack = plain_key_stack(root, "lanes", demo_model_dir, (ALPHA, BRAVO), SMALL_MODEL)
    yield stack
    stack.close()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def plain_job(stack: FaultStack, key: str, max_tokens: int) -> str:
    response = requests.post(
        f"{stack.web_url}/v1/jobs",
        json={"prompt": "once upon a time", "ignore_eos": True, "max_tokens": max_tokens},
        headers=auth(key),
        timeout=10,
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


class ConstrainedStream:
    """A streamed json_schema chat of A's, read to its end on a thread of its own as a client
    does (a stream left unread or dropped cancels its job)."""

    def __init__(self, stack: FaultStack):
        self.response = requests.post(
            f"{stack.web_url}/v1/chat/completions",
            json={
                "model": "demo",
                "messages": [{"role": "user", "content": "Write a long line."}],
                "max_tokens": LONG,
                "stream": True,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "line", "schema": SCHEMA, "strict": True},
                },
            },
            headers=auth(ALPHA),
            stream=True,
            timeout=60,
        )
        assert self.response.status_code == 200, self.response.text
        self.lines = self.response.iter_lines()
        self.job_id = self._first_id()
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _first_id(self) -> str:
        for raw in self.lines:
            if raw.startswith(b"data: "):
                return str(json.loads(raw[len(b"data: ") :])["id"])
        raise AssertionError("the chat stream ended before its first chunk")

    def _drain(self) -> None:
        try:
            for _ in self.lines:
                pass
        except (requests.RequestException, AttributeError):
            # Closed by the test: urllib3 raises AttributeError when the connection's file is
            # closed under a read in progress ('NoneType' object has no attribute 'read').
            pass

    def close(self) -> None:
        self.response.close()
        self.reader.join(10)


def first_token_seconds(stack: FaultStack) -> float:
    """B's short stream: from its post to its first token."""
    started = time.monotonic()
    job_id = plain_job(stack, BRAVO, 16)
    first = read_sse(stack.web_url, job_id, headers=auth(BRAVO), max_tokens=1, timeout=60)
    assert first.tokens and first.tokens[0]["index"] == 0
    took = time.monotonic() - started
    wait_for(lambda: statuses(stack, [job_id]) == ["succeeded"], 60, "B's job")
    return took


def settle(stack: FaultStack, job_ids: list[str]) -> None:
    """Cancel A's jobs and wait until each has ended, so the next phase starts on idle lanes."""
    for job_id in job_ids:
        requests.post(f"{stack.web_url}/v1/jobs/{job_id}/cancel", headers=auth(ALPHA), timeout=10)
    wait_for(
        lambda: all(s in ("canceled", "succeeded") for s in statuses(stack, job_ids)),
        60,
        "A's jobs to end",
    )


def running_long(stack: FaultStack, job_ids: list[str], tokens: int) -> bool:
    client = stack.client()
    try:
        return all(client.llen(keys.job_tokens(job_id)) >= tokens for job_id in job_ids)
    finally:
        client.close()


def test_constrained_chats_leave_another_key_the_reserve_lane(pair: FaultStack) -> None:
    # Control: A's plain flood fills the ordinary lane's 4 slots (and queues 4 more).
    flood = [plain_job(pair, ALPHA, LONG) for _ in range(8)]
    wait_for(lambda: running_long(pair, flood[:1], 50), 60, "A's plain flood")
    behind_flood = first_token_seconds(pair)
    settle(pair, flood)

    # A's three constrained streams: one fills the ordinary lane, the others wait for it (the
    # reserve lane is B's: A already holds a whole lane, its share of one).
    streams = [ConstrainedStream(pair) for _ in range(3)]
    ids = [stream.job_id for stream in streams]
    try:
        wait_for(lambda: running_long(pair, ids[:1], 50), 60, "A's first constrained chat")
        behind_constrained = first_token_seconds(pair)
        client = pair.client()
        try:
            done = max(client.llen(keys.job_tokens(job_id)) for job_id in ids)
        finally:
            client.close()
        assert done < LONG, "B's first token waited for one of A's chats to end"
    finally:
        settle(pair, ids)
        for stream in streams:
            stream.close()
    print(f"B's TTFT behind A's plain flood {behind_flood:.3f} s, behind its constrained "
          f"chats {behind_constrained:.3f} s")  # fmt: skip
    # Within 2x of the control; the half second absorbs a busy machine's jitter on a control
    # of tens of ms (before the fix B waited for a whole constrained chat: many seconds).
    assert behind_constrained <= 2 * behind_flood + 0.5, (behind_flood, behind_constrained)
