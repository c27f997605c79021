"""Step publishing on the real engine and a real Redis (no Celery): one Redis round trip per
decoding step, and paced flushes that carry several steps without delaying a first token or
dragging one job's held tokens out with another's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.faultstack import wait_for
from tests.scheduler_harness import Harness
from trickle import keys
from trickle.events import TokenEvent
from trickle.jobs import FinishReason
from worker.engine.engine import Engine


@pytest.fixture
def harness(demo_engine: Engine, private_redis: redis.Redis) -> Iterator[Harness]:
    h = Harness(demo_engine, private_redis, max_batch_size=8, wait_ms=100)
    yield h
    h.close()


def messages_after_the_last_flush(
    client: redis.Redis, listener: Any, job_id: str, steps: int
) -> int:
    """Once the job's replay log holds its ``steps`` tokens: the messages ``listener`` (on the
    job's channel) still has, after which it is closed."""
    wait_for(lambda: client.llen(keys.job_tokens(job_id)) == steps, 10, "the last flush")
    messages = 0
    while listener.get_message(timeout=1) is not None:
        messages += 1
    listener.close()
    return messages


def logged_events(client: redis.Redis, job_id: str) -> list[TokenEvent]:
    return [
        TokenEvent.from_log_entry(job_id, raw)
        for raw in client.lrange(keys.job_tokens(job_id), 0, -1)
    ]


def test_one_redis_round_trip_per_decoding_step(
    harness: Harness, private_redis: redis.Redis
) -> None:
    steps, batch = 40, 8
    before = harness.publisher.round_trips
    publishes_before = private_redis.info("commandstats").get("cmdstat_publish", {}).get("calls", 0)
    jobs = harness.run(
        [
            harness.job("The", max_tokens=steps, ignore_eos=True, temperature=0.0)
            for _ in range(batch)
        ]
    )
    assert [job.state.count for job in jobs] == [steps] * batch

    def publishes() -> int:
        return int(private_redis.info("commandstats")["cmdstat_publish"]["calls"])

    def landed() -> bool:  # the last flush is in Redis and counted
        logs = [private_redis.llen(keys.job_tokens(job.job_id)) for job in jobs]
        trips = harness.publisher.round_trips - before
        # Besides the flushes, each claim announces its job's status change (one PUBLISH each).
        return logs == [steps] * batch and publishes() - publishes_before <= (trips + 1) * batch

    wait_for(landed, 10, "the last flush")
    round_trips = harness.publisher.round_trips - before
    published = publishes() - publishes_before
    # 320 tokens went out in at most one round trip per decoding step; inside its one script
    # call, each job's tokens are one message on the job's own channel.
    assert round_trips <= steps
    # ...and each claim announced its job's status change (one PUBLISH each).
    assert round_trips + batch <= published <= (round_trips + 1) * batch
    for job in jobs:
        stored = private_redis.lrange(keys.job_tokens(job.job_id), 0, -1)
        assert len(stored) == steps


def test_paced_flushes_carry_several_steps_and_never_delay_the_first_token(
    demo_engine: Engine, private_redis: redis.Redis
) -> None:
    """With ``publish_interval_ms``, a job's message carries every token of the steps since
    the last flush (far fewer messages than tokens), while a first token goes out at once even
    right after another flush."""
    interval_ms = 300
    paced = Harness(
        demo_engine, private_redis, max_batch_size=8, wait_ms=0, publish_interval_ms=interval_ms
    )
    steps = 200
    try:
        paced.run([paced.job("The", max_tokens=3, ignore_eos=True, temperature=0.0)])
        job = paced.job("The", max_tokens=steps, ignore_eos=True, temperature=0.0)
        listener = private_redis.pubsub()
        listener.subscribe(keys.job_events_channel(job.job_id))
        assert listener.get_message(timeout=5)["type"] == "subscribe"  # type: ignore[index]
        submitted = time.monotonic()
        paced.scheduler.submit(job)  # the previous job's last flush was moments ago
        first = listener.get_message(timeout=5)
        first_seconds = time.monotonic() - submitted
        assert first is not None and first["type"] == "message", first
        assert job.ended.wait(60)
        messages = 1 + messages_after_the_last_flush(private_redis, listener, job.job_id, steps)
    finally:
        paced.close()
    assert first_seconds < interval_ms / 2000, f"first token after {first_seconds:.3f}s"
    events = logged_events(private_redis, job.job_id)
    assert [event.index for event in events] == list(range(steps))
    assert "".join(event.text for event in events) == job.state.output
    # Only the last entry marks the job's end: a claim after a crash finalizes on it.
    assert [event.end for event in events] == [None] * (steps - 1) + [FinishReason.LENGTH]
    assert messages < steps / 10, f"{messages} messages for {steps} tokens"


def test_an_arrival_or_an_end_flushes_only_its_own_job(
    demo_engine: Engine, private_redis: redis.Redis
) -> None:
    """Pacing is per job: short jobs starting and ending next to a long one (each a first token
    and an end, published at once) do not drag the long job's held tokens out with them; they
    wait for its own paced flush."""
    interval_ms = 150
    paced = Harness(
        demo_engine,
        private_redis,
        max_batch_size=8,
        wait_ms=0,
        publish_interval_ms=interval_ms,
        engine_threads=2,
    )
    steps, shorts = 300, 8
    try:
        long = paced.job("The", max_tokens=steps, ignore_eos=True, temperature=0.0)
        listener = private_redis.pubsub()
        listener.subscribe(keys.job_events_channel(long.job_id))
        assert listener.get_message(timeout=5)["type"] == "subscribe"  # type: ignore[index]
        began = time.monotonic()
        paced.scheduler.submit(long)
        for _ in range(shorts):  # each on the other lane while the long job runs
            short = paced.job("A socket", max_tokens=2, ignore_eos=True, temperature=0.0)
            paced.scheduler.submit(short)
            assert short.ended.wait(10)
        shorts_done = long.state.count
        assert long.ended.wait(60)
        elapsed = time.monotonic() - began
        messages = messages_after_the_last_flush(private_redis, listener, long.job_id, steps)
    finally:
        paced.close()
    assert shorts_done < steps, "the short jobs must run while the long one does"
    events = logged_events(private_redis, long.job_id)
    assert "".join(event.text for event in events) == long.state.output
    # Its own flushes only: the first tokens, one per interval, and its end (the short jobs'
    # 3 x 8 immediate flushes would each have carried a message for it).
    assert messages <= elapsed * 1000 / interval_ms + 4, f"{messages} messages in {elapsed:.2f}s"


def test_many_jobs_stretch_the_flush_interval_to_the_message_budget(
    demo_engine: Engine, private_redis: redis.Redis
) -> None:
    """Eight jobs flushed together with a budget of 100 messages/s: after the first paced
    flush the interval is 8 / 100 s = 80 ms (the 10 ms floor is for few jobs), so each job's
    channel carries about one message per 80 ms, not one per 10."""
    paced = Harness(
        demo_engine,
        private_redis,
        max_batch_size=8,
        wait_ms=50,
        publish_interval_ms=10,
        publish_max_interval_ms=200,
        publish_max_messages_per_second=100,
    )
    steps, count = 400, 8
    try:
        jobs = [
            paced.job("The", max_tokens=steps, ignore_eos=True, temperature=0.0)
            for _ in range(count)
        ]
        listener = private_redis.pubsub()
        listener.subscribe(keys.job_events_channel(jobs[0].job_id))
        assert listener.get_message(timeout=5)["type"] == "subscribe"  # type: ignore[index]
        began = time.monotonic()
        paced.run(jobs)
        elapsed = time.monotonic() - began
        stretched = paced.publisher.interval_seconds
        messages = messages_after_the_last_flush(private_redis, listener, jobs[0].job_id, steps)
    finally:
        paced.close()
    assert stretched == pytest.approx(count / 100)
    assert "".join(e.text for e in logged_events(private_redis, jobs[0].job_id)) == (
        jobs[0].state.output
    )
    # First tokens, one flush per 80 ms after the first paced one (at 10 ms), and the end.
    assert messages <= elapsed / 0.08 + 5, f"{messages} messages in {elapsed:.2f}s"
