"""Trickle's kombu Redis transport on a real Redis: what one BRPOP delivers with the messages
waiting behind it, in BRPOP's own order, within the prefetch window; the task message that
rides in a caller's transaction; and a queue paused and consumed again (a held key)."""

from __future__ import annotations

import contextlib
import threading
import time
from queue import Empty
from typing import Any

import kombu
import pytest
import redis
from kombu.utils.json import loads

from trickle.store import redis_transport

QUEUE = "drain-test"
STEPS = [0, 3, 6, 9]


def connection(client: redis.Redis, drain_max: int) -> kombu.Connection:
    port = client.connection_pool.connection_kwargs["port"]
    return kombu.Connection(
        f"redis://127.0.0.1:{port}/0",
        transport=redis_transport.TRANSPORT,
        transport_options={"priority_steps": STEPS, redis_transport.DRAIN_OPTION: drain_max},
    )


def publish(conn: kombu.Connection, bodies: list[tuple[str, int]]) -> None:
    queue = kombu.Queue(QUEUE)
    with conn.Producer() as producer:
        for body, priority in bodies:
            producer.publish(body, routing_key=QUEUE, declare=[queue], priority=priority)


def receive(conn: kombu.Connection, prefetch: int, timeout: float = 5) -> list[str]:
    """What one drain_events (one BRPOP and what comes with it) hands the consumer."""
    got: list[str] = []
    messages: list[kombu.Message] = []

    def on_message(body: Any, message: kombu.Message) -> None:
        got.append(body)
        messages.append(message)

    with conn.Consumer(kombu.Queue(QUEUE), callbacks=[on_message]) as consumer:
        consumer.qos(prefetch_count=prefetch)
        conn.drain_events(timeout=timeout)
        for message in messages:  # acked once all came: each holds its place in the window
            message.ack()
    return got


@pytest.fixture
def answered_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A BRPOP whose messages already wait counts as answered at once: on a loaded machine its
    round trip alone can outlast the 2 ms window, and these tests are about what a drain takes,
    not about the window (the window's own test below keeps it)."""
    monkeypatch.setattr(redis_transport, "DRAIN_AFTER_SECONDS", 1.0)


def test_one_brpop_delivers_what_waits_behind_it_interactive_first(
    private_redis: redis.Redis,
    answered_at_once: None,
) -> None:
    private_redis.flushdb()
    conn = connection(private_redis, drain_max=32)
    try:
        publish(conn, [("batch-1", 9), ("a", 0), ("batch-2", 9), ("b", 0), ("c", 0)])
        assert receive(conn, prefetch=64) == ["a", "b", "c", "batch-1", "batch-2"]
    finally:
        conn.release()


def test_the_prefetch_window_bounds_what_comes_with_a_brpop(
    private_redis: redis.Redis, answered_at_once: None
) -> None:
    private_redis.flushdb()
    conn = connection(private_redis, drain_max=32)
    try:
        publish(conn, [(str(i), 0) for i in range(6)])
        first = receive(conn, prefetch=3)
        assert first == ["0", "1", "2"]
        assert receive(conn, prefetch=64) == ["3", "4", "5"]  # the rest stayed queued, in order
    finally:
        conn.release()


def test_without_draining_one_brpop_is_one_message(private_redis: redis.Redis) -> None:
    private_redis.flushdb()
    conn = connection(private_redis, drain_max=0)
    try:
        publish(conn, [(str(i), 0) for i in range(3)])
        assert receive(conn, prefetch=64) == ["0"]
    finally:
        conn.release()


def test_a_brpop_that_waited_for_its_message_takes_nothing_after_it(
    private_redis: redis.Redis,
) -> None:
    """The queue was empty when the BRPOP went out, so nothing waited behind the message it
    got then: no drain follows (a round trip and five commands per job, sent one at a time).
    Messages that came meanwhile (three, in one transaction) come with the next BRPOP, which
    answers at once."""
    private_redis.flushdb()
    conn = connection(private_redis, drain_max=32)
    try:
        pipe = private_redis.pipeline(transaction=True)
        with conn.Producer() as producer:
            channel = producer.channel
            assert isinstance(channel, redis_transport.Channel)
            with channel.writing_into(pipe):
                for body in ("0", "1", "2"):
                    producer.publish(body, routing_key=QUEUE, declare=[kombu.Queue(QUEUE)])
        later = threading.Timer(0.2, pipe.execute)  # while the BRPOP below waits
        later.start()
        assert receive(conn, prefetch=64) == ["0"]
        later.join()
        assert receive(conn, prefetch=64) == ["1", "2"]
    finally:
        conn.release()


def test_a_message_published_into_a_pipeline_exists_only_once_it_runs(
    private_redis: redis.Redis,
) -> None:
    private_redis.flushdb()
    conn = connection(private_redis, drain_max=32)
    try:
        with conn.Producer() as producer:
            pipe = private_redis.pipeline(transaction=True)
            pipe.set("record", "1")
            channel = producer.channel
            assert isinstance(channel, redis_transport.Channel)
            with channel.writing_into(pipe):
                producer.publish("task", routing_key=QUEUE, declare=[kombu.Queue(QUEUE)])
            assert private_redis.get("record") is None
            with pytest.raises(TimeoutError):  # nothing was sent yet
                receive(conn, prefetch=64, timeout=0.2)
            pipe.execute()
        assert receive(conn, prefetch=64) == ["task"]
    finally:
        conn.release()


def test_messages_a_failing_consumer_did_not_take_go_back_in_order(
    private_redis: redis.Redis,
) -> None:
    private_redis.flushdb()
    conn = connection(private_redis, drain_max=32)
    try:
        publish(conn, [(str(i), 0) for i in range(5)])
        seen: list[str] = []

        def fails_on_the_second(body: Any, message: kombu.Message) -> None:
            seen.append(body)
            if len(seen) == 2:
                raise RuntimeError("consumer failed")
            message.ack()

        with conn.Consumer(kombu.Queue(QUEUE), callbacks=[fails_on_the_second]) as consumer:
            consumer.qos(prefetch_count=64)
            with pytest.raises(RuntimeError):
                conn.drain_events(timeout=5)
        assert seen == ["0", "1"]
        assert receive(conn, prefetch=64) == ["2", "3", "4"]
    finally:
        conn.release()


def test_a_message_for_a_queue_no_longer_consumed_goes_back_to_its_head(
    private_redis: redis.Redis,
) -> None:
    """A BRPOP that named a queue paused meanwhile still takes its next message: it goes back
    where it was (kombu's own requeue put it behind the whole backlog)."""
    private_redis.flushdb()
    conn = connection(private_redis, drain_max=0)
    try:
        publish(conn, [(str(i), 0) for i in range(3)])
        channel: Any = conn.default_channel
        taken = private_redis.rpop(channel._q_for_pri(QUEUE, 0))  # as BRPOP takes it
        assert taken is not None
        conn.transport._deliver(loads(taken), QUEUE)  # no consumer of QUEUE now
        assert [receive(conn, prefetch=1) for _ in range(3)] == [["0"], ["1"], ["2"]]
    finally:
        conn.release()


def test_a_queue_consumed_again_ends_the_brpop_in_flight(private_redis: redis.Redis) -> None:
    """A BRPOP in flight names the queues of before; consuming one more ends it at once (as its
    timeout would), so the next BRPOP names the new queue too."""
    private_redis.flushdb()
    conn = connection(private_redis, drain_max=0)
    try:
        channel: Any = conn.default_channel
        channel.basic_consume(QUEUE, False, lambda message: None, "first")
        channel.client.connection = channel.client.connection_pool.get_connection()
        channel.client.connection.connect()
        channel._brpop_start(timeout=30)
        assert channel._brpop_id is not None  # learned before the BRPOP was sent
        started = time.monotonic()
        channel.basic_consume(f"{QUEUE}-other", False, lambda message: None, "second")
        with pytest.raises(Empty):
            channel._brpop_read()
        assert time.monotonic() - started < 10, "the BRPOP ran to its 30 s timeout"
    finally:
        conn.release()


def test_a_delivered_message_is_in_kombus_unacked_entries_until_acked(
    private_redis: redis.Redis,
) -> None:
    """The unacked entry is sent before the consumer gets the message (its reply read later):
    once the writer settles it is in the hash and its index, as kombu's own append leaves it,
    and the ack, sent the same way, takes it out."""
    private_redis.flushdb()
    conn = connection(private_redis, drain_max=0)
    try:
        publish(conn, [("one", 0), ("two", 0)])
        seen: list[tuple[str, dict[str, str], list[str]]] = []
        messages: list[kombu.Message] = []

        def on_message(body: Any, message: kombu.Message) -> None:
            message.channel.unacked_writer.settle()
            entries = private_redis.hgetall("unacked")
            seen.append((body, entries, private_redis.zrange("unacked_index", 0, -1)))
            messages.append(message)

        with conn.Consumer(kombu.Queue(QUEUE), callbacks=[on_message]) as consumer:
            consumer.qos(prefetch_count=4)
            conn.drain_events(timeout=5)
            conn.drain_events(timeout=5)
            tags = [message.delivery_tag for message in messages]
            assert [body for body, _, _ in seen] == ["one", "two"]
            for (_body, entries, index), tag in zip(seen, tags, strict=True):
                payload, _exchange, routing_key = loads(entries[tag])
                assert payload["properties"]["delivery_tag"] == tag
                assert routing_key == QUEUE
                assert tag in index
            messages[0].ack()  # sent on the entries' connection; read back once settled
            messages[0].channel.unacked_writer.settle()
            assert set(private_redis.hkeys("unacked")) == {tags[1]}
            assert private_redis.zrange("unacked_index", 0, -1) == [tags[1]]
            messages[1].ack()
            messages[1].channel.unacked_writer.settle()
        assert private_redis.hlen("unacked") == 0
        assert private_redis.zcard("unacked_index") == 0
    finally:
        conn.release()


def test_an_unacked_message_comes_back_when_its_consumer_goes_away(
    private_redis: redis.Redis,
) -> None:
    """A consumer that closes with a message unacked (a warm shutdown, acks late) restores it to
    its queue from the entry the writer sent: the next consumer gets it."""
    private_redis.flushdb()
    conn = connection(private_redis, drain_max=0)
    try:
        publish(conn, [("kept", 0)])
        with conn.Consumer(kombu.Queue(QUEUE), callbacks=[lambda body, message: None]) as c:
            c.qos(prefetch_count=1)
            conn.drain_events(timeout=5)  # delivered, never acked
    finally:
        conn.release()  # the channel closes: kombu restores what it delivered and was not acked
    assert private_redis.hlen("unacked") == 0
    again = connection(private_redis, drain_max=0)
    try:
        assert receive(again, prefetch=1) == ["kept"]
    finally:
        again.release()


def test_an_ack_after_the_server_closed_the_idle_writer_still_lands(
    private_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replies are read late, so a connection the server closed while idle (a `timeout`, a
    restart, a CLIENT KILL) would swallow the next send; after an idle spell the writer looks
    first, and the ack goes out on a new connection."""
    private_redis.flushdb()
    monkeypatch.setattr(redis_transport.UnackedWriter, "IDLE_CHECK_SECONDS", 0.0)
    conn = connection(private_redis, drain_max=0)
    try:
        publish(conn, [("one", 0)])
        messages: list[kombu.Message] = []
        with conn.Consumer(kombu.Queue(QUEUE), callbacks=[lambda b, m: messages.append(m)]) as c:
            c.qos(prefetch_count=1)
            conn.drain_events(timeout=5)
            writer = messages[0].channel.unacked_writer
            writer.settle()
            assert private_redis.hlen("unacked") == 1
            private_redis.client_kill_filter(_type="normal", skipme=True)  # every other client
            time.sleep(0.05)
            messages[0].ack()
            writer.settle()
            assert private_redis.hlen("unacked") == 0
            assert private_redis.zcard("unacked_index") == 0
    finally:
        with contextlib.suppress(redis.RedisError, OSError):
            conn.release()
