"""Virtual token counters: shares in tokens served, not in turns, and no credit banked by idling."""

from __future__ import annotations

from collections import Counter

import pytest

from worker.fairness.vtc import OUTPUT_TOKEN_COST, PROMPT_TOKEN_COST, VirtualTokenCounter, job_cost


def test_a_job_costs_its_prompt_and_twice_its_output() -> None:
    assert job_cost(10, 5) == 10 * PROMPT_TOKEN_COST + 5 * OUTPUT_TOKEN_COST == 20
    assert job_cost(-1, -1) == 0


def serve(lengths: dict[str, int], slots: int, steps: int, lag: float) -> Counter[str]:
    """A worker of ``slots`` slots, both keys always backlogged, one token per running job per
    step; a free slot goes to the keys in turn (kombu's round robin) unless the key whose turn
    it is must wait for the other (VTC). Returns the tokens each key was served."""
    counter = VirtualTokenCounter(lag)
    running: list[tuple[str, int]] = []  # (key, tokens left)
    served: Counter[str] = Counter()
    turn = 0
    for tenant in lengths:
        counter.activate(tenant, [])
    for _ in range(steps):
        while len(running) < slots:
            order = [list(lengths)[(turn + i) % len(lengths)] for i in range(len(lengths))]
            at_work = list(lengths)
            tenant = next(t for t in order if not counter.ahead(t, at_work))
            turn = (list(lengths).index(tenant) + 1) % len(lengths)
            counter.charge(tenant, job_cost(0, lengths[tenant]))
            running.append((tenant, lengths[tenant]))
        for tenant, _ in running:
            served[tenant] += 1
        running = [(tenant, left - 1) for tenant, left in running if left > 1]
    return served


def test_turns_alone_give_long_jobs_more_of_the_engine_and_tokens_do_not() -> None:
    lengths = {"long": 128, "short": 16}
    by_turns = serve(lengths, slots=8, steps=4000, lag=0)
    assert by_turns["long"] > 5 * by_turns["short"]  # one job per turn: 8x the tokens
    by_tokens = serve(lengths, slots=8, steps=4000, lag=512)
    assert by_tokens["long"] == pytest.approx(by_tokens["short"], rel=0.1)


def test_a_key_ahead_by_more_than_the_lag_waits_for_the_least_served() -> None:
    counter = VirtualTokenCounter(100)
    counter.charge("a", 150)
    counter.charge("b", 40)
    counter.charge("c", 100)
    assert not counter.ahead("a", ["a", "c"])  # 50 ahead of c: within the lag
    assert counter.ahead("a", ["a", "b", "c"])  # 110 ahead of b
    assert not counter.ahead("a", [])  # nobody else at work: never waits
    assert not VirtualTokenCounter(0).ahead("a", ["b"])  # lag 0: turns only
    assert counter.least_served_first(["a", "b", "c"]) == ["b", "c", "a"]


def test_a_weight_divides_what_a_key_is_charged() -> None:
    counter = VirtualTokenCounter(100, weight=lambda tenant: 4 if tenant == "heavy" else 1)
    counter.charge("heavy", 400)
    counter.charge("light", 100)
    assert counter.counter("heavy") == counter.counter("light") == 100


def test_idling_banks_no_credit_and_an_old_heavy_user_owes_nothing() -> None:
    counter = VirtualTokenCounter(100)
    counter.activate("busy", [])
    counter.charge("busy", 10_000)
    counter.activate("late", ["busy"])  # lifted to the least-served key at work
    assert counter.counter("late") == 10_000
    counter.charge("late", 50)
    assert not counter.ahead("late", ["busy"])
    # Everyone left; the heavy user comes back first, then a newcomer: level, not 10,050 behind.
    counter.activate("new", [])
    assert counter.counter("new") == 10_050
    counter.activate("busy", ["new"])
    assert counter.counter("busy") == 10_050
    # A counter is never lowered.
    counter.charge("late", 5_000)
    counter.activate("late", ["new"])
    assert counter.counter("late") == 15_050
