"""Rows that need their own logits, sharing one ``generate_batch``: constrained jobs and jobs
reporting alternatives batch together instead of each holding a lane.

How CTranslate2 hands a batched step's logits (``return_logits_vocab``; ``GreedySearch`` in its
``decoding.cc``, read for 4.8 and measured on 4.8.5): the first callback of a step gets the
whole ``[live rows, vocabulary]`` matrix, every later callback of that step an empty one. Its
rows are the live rows in the call's own order: ``generate_batch`` sorts the prompts longest
first, feeds a longer prompt's extra tokens one per step (such a row calls back only once it
generates), drops a row after the step it finished in, and calls the rows back in that same
order (each with its own index restored as ``batch_id``). So the k-th callback of a step reads
row ``feeding + k``, ``feeding`` being the live rows still in their prompt, which lead.

That order is CTranslate2's, not a promise: every row read is checked against the token the
row proposed, by its log-softmax at that token, which must equal the log-probability
CTranslate2 reported for it (``return_scores``: before temperature, greedy or sampled). A row
that fails the check ends the shared call at once, before its token is used, and the rows
still going then run one at a time, alone, from what they emitted.

A refused token stops only its row (the callback's True ends one row of a CTranslate2 call):
its replacement and the tokens the grammar forces after it are emitted at once, and the row
waits, parked, for the next call. The call goes on for the others until half its rows are
parked, or one has waited ``PARK_STEPS`` steps; then every row stops at its next token
(dropped unseen, made again by the next call) and the next call starts each row from its
prompt plus everything it emitted, in one prefill. A refusal alone restarted its own call
every time; shared, one prefill serves several refusals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from worker.engine.alternatives import row_logits
from worker.engine.constrained import ConstrainedRun, RowCall
from worker.engine.request import Logprob

log = logging.getLogger(__name__)

# A parked row waits at most this many steps of the others for its next call.
PARK_STEPS = 16
# How far a row's log-softmax at its token may be from CTranslate2's log-probability (float32).
LOGPROB_TOLERANCE = 1e-3

Logits = npt.NDArray[np.float64]
# (position, step, token id, log-probability, is last) -> stop; StepStream.token.
StreamSink = Callable[[int, int, int, Logprob, bool], bool]
# (step, its row's logits) -> what an accepted token reports (alternatives.Scores.for_job).
RowScorer = Callable[[Any, Callable[[], Logits | None]], Logprob]
# (prompts, max new tokens, callback): one generate_batch with the logits of every row.
BatchCall = Callable[[list[list[str]], int, Callable[[Any], bool]], None]


@dataclass
class _Pace:
    """One call's yield: tokens emitted since it started (its prefill included in the time)."""

    started: float
    emitted: int = 0
    last_step_at: float | None = None
    now: float = 0.0

    def stepped(self, now: float, average: float) -> float:
        """A step began: the recent step time, updated."""
        self.now = now
        if self.last_step_at is not None:
            interval = now - self.last_step_at
            average = interval if average <= 0 else 0.7 * average + 0.3 * interval
        self.last_step_at = now
        return average

    def restart_pays(self, going: int, step_seconds: float) -> bool:
        """Whether a restart now yields more tokens per second than going on: the rows still
        going make ``going`` tokens a step; a new call yields about what this one did so far,
        whose time counts its prefill (the marginal value rule: leave a patch once its rate
        falls below the average over the patch and the way to it)."""
        if going == 0:
            return True
        if step_seconds <= 0 or self.now <= self.started:
            return False
        return going / step_seconds < self.emitted / (self.now - self.started)


class RowsLost(Exception):
    """A row's logits did not match its token: CTranslate2 ordered them otherwise."""


class RowLogits:
    """One call's batched logits, mapped to the row of each callback (module docstring)."""

    def __init__(self, lengths: list[int]):
        shortest = min(lengths)
        self._first_step = [length - shortest for length in lengths]
        self._live = set(range(len(lengths)))
        self._step = -1
        self._holder: Any = None  # the step's first callback's result: it holds the matrix
        self._matrix: npt.NDArray[Any] | None = None
        self._called = 0
        self._feeding = 0
        self._checked: dict[int, Logits] = {}
        self.checks = 0

    def index(self, step: Any) -> int:
        """The matrix row of this callback; every callback of the call comes through here."""
        if step.step != self._step:
            self._step = step.step
            self._holder = step
            self._matrix = None
            self._checked = {}
            self._called = 0
            self._feeding = sum(1 for p in self._live if self._first_step[p] > step.step)
        index = self._feeding + self._called
        self._called += 1
        return index

    def row(self, index: int, step: Any) -> Logits:
        """Row ``index`` of the step, checked against ``step``'s token and log-probability."""
        if index in self._checked:
            return self._checked[index]
        if self._matrix is None:
            try:
                whole = np.asarray(self._holder.logits)
            except (ValueError, TypeError) as exc:  # (a device CTranslate2 keeps them on)
                raise RowsLost("the step's logits are not readable here") from exc
            self._matrix = whole.reshape(whole.shape[0], -1) if whole.ndim else None
        matrix = self._matrix
        if matrix is None or index >= matrix.shape[0]:
            raise RowsLost(f"no row {index} in the step's logits")
        row = np.asarray(matrix[index], dtype=np.float64)
        token = int(step.token_id)
        top = float(row.max())
        logprob = row[token] - top - float(np.log(np.exp(row - top).sum()))
        expected = float(step.log_prob)
        self.checks += 1
        if not abs(logprob - expected) <= LOGPROB_TOLERANCE * max(1.0, abs(expected)):
            raise RowsLost(f"row {index}: log-probability {logprob:.4f}, reported {expected:.4f}")
        self._checked[index] = row
        return row

    def ended(self, position: int) -> None:
        """Row ``position`` stopped in this step: CTranslate2 drops it after the step."""
        self._live.discard(position)


@dataclass
class SharedRow:
    """One job of a shared batch: where it stands between calls."""

    position: int
    pieces: list[str]  # its prompt plus every token emitted (the next call's prompt)
    left: int  # tokens its budget has left
    run: ConstrainedRun | None  # its grammar, if any
    score: RowScorer
    checked: bool  # its logits are read (a grammar or alternatives): each read is checked
    done: bool = False
    call: RowCall = field(default_factory=RowCall)
    parked_at: int | None = None  # the step it parked at, in this call
    emitted: list[int] = field(default_factory=list)  # this call's, accepted and forced


class SharedRows:
    """Runs rows that read their own logits as shared calls (module docstring)."""

    def __init__(
        self,
        rows: list[SharedRow],
        to_piece: Callable[[int], str],
        sink: StreamSink,
        expect: Callable[[int, int | None], None],
    ):
        """``sink``: the batch's stream; ``expect(position, step)``: when a row speaks next
        (None: not before a later call), so the stream knows when a step is complete."""
        self._rows = rows
        self._to_piece = to_piece
        self._sink = sink
        self._expect = expect
        self._base = 0  # the global step of the current call's step 0
        self._step = 0  # the global step being run
        self._step_seconds = 0.0  # recent decoding step time (moving average)
        self.calls = 0
        self.lost = False

    def run(self, generate: BatchCall, alone: BatchCall) -> None:
        """Shared calls until every row is done; alone ones after a failed check."""
        while not self.lost:
            rows = [row for row in self._rows if not row.done and row.left > 0]
            if not rows:
                return
            self._call(rows, generate)
        for row in self._rows:
            if not row.done and row.left > 0:
                self._call([row], alone, checked=False)
                while not row.done and row.left > 0:
                    self._call([row], alone, checked=False)

    def _call(self, rows: list[SharedRow], generate: BatchCall, checked: bool = True) -> None:
        self.calls += 1
        shortest = min(len(row.pieces) for row in rows)
        for row in rows:
            row.call = RowCall()
            row.parked_at = None
            row.emitted = []
            self._expect(row.position, self._base + len(row.pieces) - shortest)
        mapping = RowLogits([len(row.pieces) for row in rows])
        pace = _Pace(time.perf_counter())
        due = False
        last_step = -1

        def on_step(step: Any) -> bool:
            nonlocal due, last_step
            if step.step > last_step:
                last_step = step.step
                self._step_seconds = pace.stepped(time.perf_counter(), self._step_seconds)
            self._step = self._base + step.step
            slot = int(step.batch_id)
            row = rows[slot]
            index = mapping.index(step)
            if due or row.parked_at is not None or row.done:
                mapping.ended(slot)
                return True  # past a due restart: dropped, the next call makes it again
            before = row.left
            stop = self._token(
                row, step, lambda: self._row_logits(mapping, index, step, checked), checked
            )
            pace.emitted += before - row.left
            if self.lost and checked:
                due = True
                stop = True
            if stop:
                mapping.ended(slot)
            parked = [r.parked_at for r in rows if r.parked_at is not None]
            if parked:
                going = sum(1 for r in rows if r.parked_at is None and not r.done)
                waited = self._step - min(parked)
                due = waited >= PARK_STEPS or pace.restart_pays(going, self._step_seconds)
            return stop

        generate([row.pieces for row in rows], max(row.left for row in rows), on_step)
        self._base += last_step + 1
        for row in rows:
            row.pieces.extend(self._to_piece(token) for token in row.emitted)

    def _row_logits(
        self, mapping: RowLogits, index: int, step: Any, checked: bool
    ) -> Logits | None:
        """The callback's row: checked in a shared call, the only one alone."""
        return mapping.row(index, step) if checked else row_logits(step)

    def _token(
        self, row: SharedRow, step: Any, logits: Callable[[], Logits | None], checked: bool
    ) -> bool:
        """One proposed token of ``row``; True stops the row in this call."""
        if row.checked and checked:
            try:
                logits()  # checked before the token is used: a lost order uses nothing
            except RowsLost as lost:
                log.warning("shared rows run alone from here: %s", lost)
                self.lost = True
                return True
        sink = self._row_sink(row)
        if row.run is None:
            stop = sink(int(step.token_id), row.score(step, logits), bool(step.is_last))
            row.done = stop
            return stop
        call = row.call
        stop = row.run.on_token(call, step, logits, sink)
        if not stop:
            return False
        if call.ended or not (call.rejected or call.closing):
            row.done = True
            return True
        if row.run.settle(call, sink) is None:
            row.done = True
        else:
            row.parked_at = self._step
            self._expect(row.position, None)
        return True

    def _row_sink(self, row: SharedRow) -> Callable[[int, Logprob, bool], bool]:
        def emit(token: int, logprob: Logprob, last: bool) -> bool:
            row.emitted.append(token)
            row.left -= 1
            stop = self._sink(row.position, self._step, token, logprob, last)
            if stop or row.left <= 0:
                row.done = True
            return stop

        return emit
