"""Whether a constrained job shares a batch: only while the model's measured refusals let
sharing cost less than running alone.

A refused token stops its row (worker/engine/constrained.py), and a shared call restarts with a
prefill of every row (worker/engine/shared_rows.py). Per token the model proposes, with ``r``
refusals per proposed token, ``s(n)`` a decoding step's time at ``n`` rows, ``p`` a prompt
token's share of a prefill and ``L`` a row's length (prompt plus generated):

- alone, a row pays its step and, per refusal, its own prefill: ``s(1) + r * L * p``;
- shared by ``n`` rows, a row pays its share of a step and, per refusal, a restart that
  prefills every row: ``s(n) / n + r * n * L * p``.

Sharing wins while ``r`` is below the break-even
``r* = (s(1) - s(n) / n) / ((n - 1) * L * p)``. Counting a whole restart per refusal is the
pessimistic end (a restart may serve several parked rows), and stands in for what the model
leaves out: a restarted call feeds its longer rows' extra tokens one step at a time, and parked
rows wait. On the demo model (a bigram table that refuses about one token in five) sharing
measured slower than running alone; on a model that follows the schema ``r`` is near 0.

``r`` is measured by the engine process in every constrained call, shared or alone (a refusal
is the model's and the grammar's, not the batch's), and carried back in each batch's end
message, so the estimate keeps learning while jobs run alone and recovers by itself once the
refusals drop: no probe batch is needed. It starts at 0 (nothing refused yet: share), and
decays by tokens (``HALF_LIFE_TOKENS``), so recent jobs weigh most.

Jobs that only report alternatives (no grammar) are never refused and always share. The gate
decides once per job, when the scheduler takes it in; ``policy.alone`` then reads the decision
from the request, so every batching rule sees the same answer.
"""

from __future__ import annotations

import dataclasses
import math
import threading

from worker.engine.request import EngineRequest
from worker.engine.step_times import StepTimes

# Proposed tokens after which an observation weighs half as much.
HALF_LIFE_TOKENS = 2000.0


class RefusalRate:
    """Refusals per token proposed to a grammar, decayed by tokens; shared by a model's lanes."""

    def __init__(self, half_life_tokens: float = HALF_LIFE_TOKENS):
        self._lock = threading.Lock()
        self._half_life = half_life_tokens
        self._proposed = 0.0
        self._refused = 0.0

    def observe(self, proposed: int, refused: int) -> None:
        """A batch's constrained rows were proposed ``proposed`` tokens and refused
        ``refused`` of them (those that cost a row its call)."""
        if proposed <= 0:
            return
        with self._lock:
            decay = 0.5 ** (proposed / self._half_life)
            self._proposed = self._proposed * decay + proposed
            self._refused = self._refused * decay + min(refused, proposed)

    @property
    def rate(self) -> float:
        """The estimate; 0 before anything was measured (start optimistic)."""
        with self._lock:
            return self._refused / self._proposed if self._proposed > 0 else 0.0


def break_even_rate(
    alone_step: float, shared_step: float, rows: int, length: float, prefill_per_token: float
) -> float:
    """The refusal rate at which ``rows`` rows sharing calls cost as much per token as each
    alone (module docstring): 0 when sharing saves no step time, infinite when a restart is
    free."""
    gain = alone_step - shared_step / max(rows, 1)
    if rows < 2 or gain <= 0:
        return 0.0
    restart = (rows - 1) * length * prefill_per_token
    return math.inf if restart <= 0 else gain / restart


class SharingGate:
    """Decides, per job, whether a constrained one may share a batch (module docstring)."""

    def __init__(
        self, refusals: RefusalRate, step_times: StepTimes, prefill_per_token: float, rows: int
    ):
        """``rows``: the batch size the decision is priced at (``max_batch_size``: the
        break-even falls as rows grow, so the largest batch is the safe side)."""
        self.refusals = refusals
        self._step_times = step_times
        self._prefill_per_token = prefill_per_token
        self._rows = rows

    def break_even(self, request: EngineRequest) -> float:
        """The refusal rate below which ``request`` shares, priced at its mid-run length."""
        alone = self._step_times.estimate(1)
        shared = self._step_times.estimate(self._rows)
        if alone is None or shared is None:
            return math.inf  # nothing measured yet: optimistic
        length = len(request.prompt_ids) + request.max_new_tokens / 2
        return break_even_rate(alone, shared, self._rows, length, self._prefill_per_token)

    def shares(self, request: EngineRequest) -> bool:
        """Whether ``request`` may share a batch: always without a grammar, else while the
        measured refusal rate is below its break-even."""
        if request.grammar is None:
            return True
        return self.refusals.rate < self.break_even(request)

    def decided(self, request: EngineRequest) -> EngineRequest:
        """``request`` as the scheduler takes it in, marked with today's decision (a job taken
        in again, e.g. resumed, is decided again)."""
        shares = self.shares(request)
        if request.shares_calls == shares:
            return request
        return dataclasses.replace(request, shares_calls=shares)
