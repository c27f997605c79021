"""A Redis crash that loses its last writes never costs a stream its tail (issue 44).

Redis acknowledges a write before its append-only file has it on disk (``appendfsync
everysec``; under a slow disk even the ``write`` is put off for up to two seconds), so a crash
can restart it without its last second. Here that loss is made exact: Redis runs without
persistence, a ``SAVE`` marks what the restarted server will hold, tokens go on streaming, then
Redis is SIGKILLed and started again from that snapshot. The job's replay log is now shorter than
what readers already saw, while its worker, which never stopped generating, finishes the job
during the outage. A reader resuming past the shortened log (SSE ``Last-Event-ID``, WebSocket
``after``, Responses ``starting_after``) must get every remaining token, then its end, and the
streamed text must be the stored output; without the worker restoring the lost tokens before
storing the final state, these readers got ``done`` at once with every later token missing.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.clients import StreamResult, poll_until_finished, read_sse, read_ws, submit
from tests.faultstack import FaultStack, build_fault_stack, build_slow_model, wait_for
from tests.system.test_responses import raw_events
from trickle import keys

pytestmark = pytest.mark.timeout(120)

TOKENS = 500
RESPONSE = {
    "model": "demo",
    "input": "The value",
    "max_output_tokens": TOKENS,
    "temperature": 0,
    "background": True,
    "ignore_eos": True,
}
DELTA = "response.output_text.delta"


@pytest.fixture(scope="module")
def lossy(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[FaultStack]:
    root = tmp_path_factory.mktemp("lost-writes")
    slow = build_slow_model(
        root, demo_model_dir / "tokenizer.model", d_model=256, num_layers=4, ffn_dim=768
    )
    stack = build_fault_stack(
        root,
        # The slow model as the default one: /readyz waits for its worker.
        models_toml=f'[models.demo]\npath = "{slow}"\ninter_threads = 1\n',
        settings_toml=(
            # A lease longer than the first test's outage (the job stays its worker's), short
            # enough that a lost final state's lease lapses within the last test.
            "[worker]\nlease_seconds = 15\nrecovery_interval_seconds = 0.5\n"
            "heartbeat_seconds = 0.5\n"
            "[limits]\nmax_tokens_ceiling = 2000\n"
            "[web]\nkeepalive_seconds = 1.0\n"
        ),
        append_only=False,  # what survives the kill is exactly the SAVE
    )
    stack.worker("lossy", ("demo",))
    yield stack
    stack.close()


def ready(base: str) -> bool:
    try:
        return requests.get(f"{base}/readyz", timeout=5).status_code == 200
    except requests.RequestException:
        return False


def test_a_reader_resuming_after_lost_writes_gets_every_token_before_done(
    lossy: FaultStack,
) -> None:
    base = lossy.web_url
    wait_for(lambda: ready(base), 60, "ready", interval=0.2)
    # A background response: one job that native streams and a Responses stream both read.
    created = requests.post(f"{base}/v1/responses", json=RESPONSE, timeout=30)
    assert created.status_code == 200, created.text
    response_id = created.json()["id"]
    job = {"id": "job_" + response_id[len("resp_") :]}
    log_key = keys.job_tokens(job["id"])
    with lossy.client() as client:
        wait_for(lambda: client.llen(log_key) >= 50, 60, "the job streaming")
        began, first = time.monotonic(), client.llen(log_key)
        client.save()  # the restarted Redis holds this: what follows is lost
        kept = client.llen(log_key)
        wait_for(lambda: client.llen(log_key) >= kept + 150, 60, "tokens after the snapshot")
        seen = client.lrange(log_key, 0, -1)  # what a reader had streamed when Redis died
        rate = (len(seen) - first) / (time.monotonic() - began)
        assert client.hget(keys.job(job["id"]), "status") == "running"
    os.kill(lossy.redis_process.pid, signal.SIGKILL)
    lossy.redis_process.wait()
    # The worker goes on generating and ends the job meanwhile (its flushes retry).
    time.sleep(min(2.0 * (TOKENS - len(seen)) / rate + 1.0, 10.0))
    lossy.start_redis(append_only=False)
    with lossy.client() as client:
        short = client.llen(log_key) < len(seen)
    if not short:  # the worker may already have restored them: its log says it did
        restoring = f"job {job['id']}: the replay log lost tokens"
        log_path = lossy.log_dir / "lossy.log"
        wait_for(lambda: restoring in log_path.read_text(errors="replace"), 10, "a lost log")
    wait_for(lambda: ready(base), 60, "ready after the restart", interval=0.2)

    last = len(seen) - 1
    prefix = "".join(json.loads(entry)["text"] for entry in seen)
    sse = read_sse(base, job["id"], headers={"Last-Event-ID": str(last)}, timeout=90)
    ws = read_ws(base, job["id"], query=f"?after={last}", timeout=90)
    whole = read_sse(base, job["id"], timeout=90)
    print(f"kept {kept} of {len(seen)} seen tokens; {rate:.0f} tokens/s")
    for stream in (sse, ws):
        assert_rest(stream, last + 1, prefix)
    assert whole.indexes == list(range(TOKENS)) and whole.text == prefix + sse.text
    # Responses: the whole event stream, and one resumed (starting_after) past the kept log.
    events = raw_events(base, response_id)
    assert events[-1]["type"] == "response.incomplete"  # max_output_tokens reached
    assert "".join(e["delta"] for e in events if e["type"] == DELTA) == whole.text
    first_delta = next(i for i, e in enumerate(events) if e["type"] == DELTA)
    after = events[first_delta + last]["sequence_number"]
    assert raw_events(base, response_id, after=after) == events[after + 1 :]
    done = sse.done
    assert done is not None
    assert done["attempts"] == 1  # the worker kept its lease: nothing was generated twice


def assert_rest(stream: StreamResult, first: int, prefix: str) -> None:
    """Every token from ``first`` on, then ``done`` with the whole text as its output."""
    assert stream.done is not None, stream.error
    assert stream.done["status"] == "succeeded"
    assert stream.done["usage"]["completion_tokens"] == TOKENS
    assert stream.indexes == list(range(first, TOKENS)), "done before every token"
    assert prefix + stream.text == stream.done["output"]


def crash_back_to_the_save(stack: FaultStack) -> None:
    """SIGKILL Redis and start it again from its last SAVE: what follows the SAVE is lost."""
    os.kill(stack.redis_process.pid, signal.SIGKILL)
    stack.redis_process.wait()
    stack.start_redis(append_only=False)
    wait_for(lambda: ready(stack.web_url), 60, "ready after the restart", interval=0.2)


def test_a_lost_job_and_its_idempotency_key_go_together(lossy: FaultStack) -> None:
    """A POST answered in the lost second: its record, its task and its key were written in one
    script, so they are lost together (a GET answers 404, the loss ``appendfsync always``
    prevents), and the client's retry with the same key creates the job once, which runs."""
    base = lossy.web_url
    wait_for(lambda: ready(base), 60, "ready", interval=0.2)
    with lossy.client() as client:
        client.save()
    key = f"lost-{uuid.uuid4()}"
    body = {"prompt": "The", "max_tokens": 8}
    first = requests.post(
        f"{base}/v1/jobs", json=body, headers={"Idempotency-Key": key}, timeout=30
    )
    assert first.status_code == 202, first.text
    crash_back_to_the_save(lossy)
    assert requests.get(f"{base}/v1/jobs/{first.json()['id']}", timeout=10).status_code == 404
    again = requests.post(
        f"{base}/v1/jobs", json=body, headers={"Idempotency-Key": key}, timeout=30
    )
    assert again.status_code == 202 and again.json()["id"] != first.json()["id"]
    replay = requests.post(
        f"{base}/v1/jobs", json=body, headers={"Idempotency-Key": key}, timeout=30
    )
    assert replay.json()["id"] == again.json()["id"]  # one job for the key from now on
    assert poll_until_finished(base, again.json()["id"], timeout=60)["status"] == "succeeded"


def test_a_lost_final_state_is_stored_again_by_its_worker(lossy: FaultStack) -> None:
    """The job ended in the lost second: Redis comes back with it running under the lease of
    its worker, which has moved on. The worker's heartbeat finds a new run_id, and it sends the
    final states it stored lately again (the log restored first): the job ends as it ended,
    attempt 1, nothing generated twice, and a reader gets every token once, then ``done``."""
    base = lossy.web_url
    wait_for(lambda: ready(base), 60, "ready", interval=0.2)
    # Long enough (about a millisecond a token here) that the SAVE falls while it streams.
    job = submit(base, {"prompt": "The value", "max_tokens": 400, "ignore_eos": True})
    log_key = keys.job_tokens(job["id"])
    with lossy.client() as client:
        wait_for(lambda: client.llen(log_key) >= 5, 60, "the job streaming")
        client.save()
        wait_for(lambda: client.hget(keys.job(job["id"]), "status") == "succeeded", 60, "the end")
        ended = client.hget(keys.job(job["id"]), "output")
    crash_back_to_the_save(lossy)  # the job ran on in it; its worker may have noticed already
    stream = read_sse(base, job["id"], timeout=30)
    assert stream.done is not None and stream.done["status"] == "succeeded", stream.error
    assert stream.indexes == list(range(400)) and stream.text == stream.done["output"] == ended
    assert stream.done["attempts"] == 1
    restored = f"job {job['id']}: its final state was lost with Redis; stored again"
    log_path = lossy.log_dir / "lossy.log"
    wait_for(lambda: restored in log_path.read_text(errors="replace"), 10, "the worker's note")
