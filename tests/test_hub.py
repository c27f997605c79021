"""The web process's fan-out mailbox: bounded, and a slow reader is told to re-read the log."""

from __future__ import annotations

import redis

from web.hub import MAX_PENDING, Delivery, Signal, Subscription, TokenHub
from worker.events import TokenEvent


def make_subscription() -> Subscription:
    hub = TokenHub(lambda: redis.Redis())  # never started: these tests only use the mailbox
    return Subscription(hub, "job_x")


def test_queued_deliveries_are_taken_together() -> None:
    subscription = make_subscription()
    for index in range(3):
        subscription.put(Delivery(tokens=(TokenEvent("job_x", index, "a"),)))
    taken = subscription.get_all(timeout=0.1)
    assert [d.tokens[0].index for d in taken] == [0, 1, 2]
    assert subscription.get_all(timeout=0.01) == []


def test_a_reader_that_falls_behind_gets_one_resync_instead_of_a_backlog() -> None:
    subscription = make_subscription()
    for index in range(MAX_PENDING + 50):
        subscription.put(Delivery(tokens=(TokenEvent("job_x", index, "a"),)))
    taken = subscription.get_all(timeout=0.1)
    assert len(taken) < MAX_PENDING  # memory stays bounded
    assert taken[0].signal is Signal.RESYNC  # and the reader knows to re-read the replay log
    assert subscription.overflows == 1
