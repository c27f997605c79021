"""Virtual token counters: each key's share of a worker counted in tokens served, not in turns.

Turns alone (kombu's round robin between the keys' queues, one job per turn) give a key sending
128-token jobs eight times the engine of a key sending 16-token ones: each holds its slots
for as long as its jobs run. The Virtual Token Counter of Sheng et al., "Fairness in Serving
Large Language Models" (OSDI 2024), which llm-d and the Gateway API inference extension's flow
control take up, counts instead what each key was served, in tokens weighted by their cost
(a prompt token is prefilled in parallel, an output token costs a decoding step), divided by
the key's weight, and serves the key that was served least:

- a key's counter grows by the cost of each job it is served;
- a key that comes back after an idle spell starts level with the least-served key still at
  work (its counter is lifted to theirs), so idling banks no credit; with nobody at work it
  starts level with the most-served key ever counted, so an earlier heavy user owes nothing;
- a key whose counter is more than ``lag_tokens`` ahead of the least-served other key at work
  waits, so that key is served first.

Pure logic over counters; the worker's dispatcher calls it under its lock
(``worker.fairness.token_shares``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

# The paper's default weights: an output token costs about twice a prompt token.
PROMPT_TOKEN_COST = 1.0
OUTPUT_TOKEN_COST = 2.0


def job_cost(prompt_tokens: int, output_tokens: int) -> float:
    """The service one job receives, in weighted tokens."""
    return PROMPT_TOKEN_COST * max(prompt_tokens, 0) + OUTPUT_TOKEN_COST * max(output_tokens, 0)


def _equal_weights(_: str) -> int:
    return 1


class VirtualTokenCounter:
    """Each key's served tokens (over its weight), and which key must wait for another."""

    def __init__(self, lag_tokens: float, weight: Callable[[str], int] = _equal_weights):
        """``lag_tokens``: how far ahead of the least-served key at work a key may get before
        it waits (the fairness bound: the paper proves shares within about two jobs' cost of
        each other while both keys have work); ``weight``: a key's share (``[keys.<name>]
        weight``), dividing what it is charged."""
        self.lag_tokens = lag_tokens
        self._weight = weight
        self._counters: dict[str, float] = {}

    def counter(self, tenant: str) -> float:
        return self._counters.get(tenant, 0.0)

    def activate(self, tenant: str, at_work: Iterable[str]) -> None:
        """``tenant`` has work again after none: lift it to the least-served key ``at_work``
        (or, with none at work, to the most-served key counted), never lower it."""
        others = [self.counter(other) for other in at_work if other != tenant]
        level = min(others) if others else max(self._counters.values(), default=0.0)
        self._counters[tenant] = max(self.counter(tenant), level)

    def charge(self, tenant: str, cost: float) -> None:
        """Count ``cost`` weighted tokens served to ``tenant`` (negative: a refund of an
        estimate that proved too high)."""
        self._counters[tenant] = self.counter(tenant) + cost / max(self._weight(tenant), 1)

    def ahead(self, tenant: str, rivals: Iterable[str]) -> bool:
        """Whether ``tenant`` must wait: it was served more than ``lag_tokens`` beyond the
        least-served of ``rivals`` (other keys at work that could take the slot)."""
        if self.lag_tokens <= 0:
            return False
        others = [self.counter(other) for other in rivals if other != tenant]
        return bool(others) and self.counter(tenant) - min(others) > self.lag_tokens

    def least_served_first(self, tenants: Iterable[str]) -> list[str]:
        """``tenants`` in the order VTC serves them (ties keep their order)."""
        return sorted(tenants, key=self.counter)
