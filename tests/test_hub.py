"""The web process's fan-out: one shared feed per job, a cursor per reader."""

from __future__ import annotations

import redis

from web.hub import Delivery, Signal, TokenHub


def make_hub() -> TokenHub:
    hub = TokenHub(lambda: redis.Redis())
    hub._ready.set()  # these tests feed the hub by hand; no Redis subscription is started
    hub._thread = object()  # type: ignore[assignment]
    return hub


def test_every_reader_sees_every_delivery_from_when_it_subscribed() -> None:
    hub = make_hub()
    early = hub.subscribe("job_x")
    hub._dispatch('{"t": [["job_x", 0, "a", null]], "d": []}')
    late = hub.subscribe("job_x")
    hub._dispatch('{"t": [["job_x", 1, "b", null], ["job_x", 2, "c", null]], "d": ["job_x"]}')
    seen_early = early.get_all(timeout=0.1)
    assert [e.index for d in seen_early for e in d.tokens] == [0, 1, 2]
    assert seen_early[-1].signal is Signal.DONE
    assert [e.index for d in late.get_all(timeout=0.1) for e in d.tokens] == [1, 2]
    assert early.get_all(timeout=0.01) == []


def test_a_message_costs_one_append_per_job_whatever_the_readers() -> None:
    hub = make_hub()
    readers = [hub.subscribe("job_x") for _ in range(1000)]
    for index in range(50):
        hub._dispatch(f'{{"t": [["job_x", {index}, "a", null]], "d": []}}')
    assert len(hub._feeds["job_x"].deliveries) == 50  # shared, not copied per reader
    assert hub.active_subscriptions == 1000
    assert len(readers[-1].get_all(timeout=0.1)) == 50
    for reader in readers:
        reader.close()
    assert hub._feeds == {} and hub.active_subscriptions == 0


def test_a_reconnect_tells_every_reader_to_resync() -> None:
    hub = make_hub()
    reader = hub.subscribe("job_x")
    hub._broadcast(Delivery(signal=Signal.RESYNC))
    (delivery,) = reader.get_all(timeout=0.1)
    assert delivery.signal is Signal.RESYNC


def test_closing_a_subscription_again_never_counts_twice() -> None:
    hub = make_hub()
    first, second = hub.subscribe("job_x"), hub.subscribe("job_x")
    for _ in range(3):
        first.close()  # the view, the stream's generator and follow_many may all close it
    assert hub.active_subscriptions == 1
    second.close()
    assert hub.active_subscriptions == 0
