"""One batch's tokens as they go from the engine's callback to the worker, step by step.

Steps faster than ``engine_step_coalesce_ms`` share a pipe message (worker/engine/process.py
says why); a step with a sequence's first tokens or its end goes at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from worker.engine.batch_command import BatchCommand
from worker.engine.request import Logprob

StepToken = tuple[int, int, int, Logprob, bool]
# One decoding step as sent: its start (time.monotonic) and its tokens.
SentStep = tuple[float, list[StepToken]]

# A sequence's first tokens go to the worker at once (its first may decode to no visible text):
# the publisher sends the same ones unpaced (worker/publisher.py).
UNHELD_TOKENS = 2
NEVER = 1 << 62  # the step of a row that is not expected to speak


class StepStream:
    """Collects one batch's tokens per decoding step and sends complete steps, together while
    they come faster than ``coalesce_seconds``.

    A step is complete when every live sequence expected to speak in it has (a sequence with a
    longer prompt starts later: CTranslate2 feeds its extra prompt tokens through the loop), or
    when the next step begins; a wrong expectation costs a late decision, never a token. A
    complete step goes at once when it holds a sequence's first tokens or its end, or when the
    last message went ``coalesce_seconds`` ago; else it waits for the next step's decision.
    """

    def __init__(
        self,
        command: BatchCommand,
        flags: memoryview,
        send: Callable[[tuple[Any, ...]], None],
        coalesce_seconds: float = 0.0,
    ):
        self._batch_id = command.batch_id
        self._slots = command.slots
        self._max_new = command.max_new_tokens
        self._flags = flags
        self._send = send
        self._coalesce = coalesce_seconds
        lengths = [len(prompt) for prompt in command.prompts]
        shortest = min(lengths)
        self._first_step = [length - shortest for length in lengths]
        self._counts = [0] * len(lengths)
        self._live = set(range(len(lengths)))
        self._step = -1
        self._step_started = 0.0
        self._expected = 0
        self._reported = 0
        self._urgent = False  # the step being collected holds a first token or an end
        self._decided = True  # the step being collected was sent or held already
        self._tokens: list[StepToken] = []  # the step being collected
        self._held: list[SentStep] = []  # complete steps not sent yet
        self._sent_at = float("-inf")

    def token(
        self, position: int, step: int, token_id: int, logprob: Logprob, is_last: bool
    ) -> bool:
        """Record one sequence's token; True stops that sequence (flag set, or its last)."""
        if step != self._step:
            if not self._decided:
                self._step_done()
            self._step = step
            self._step_started = time.monotonic()
            self._expected = sum(1 for p in self._live if self._first_step[p] <= step)
            self._reported = 0
            self._decided = False
        self._reported += 1
        if self._flags[self._slots[position]]:
            stop = True  # the worker ended it: this token is past its end, never sent
        else:
            count = self._counts[position] = self._counts[position] + 1
            stop = is_last or count >= self._max_new[position]
            self._tokens.append((position, step, token_id, logprob, stop))
            if stop or count <= UNHELD_TOKENS:
                self._urgent = True
        if stop:
            self._live.discard(position)
        if self._reported >= self._expected and not self._decided:
            self._step_done()
        return stop

    def expect(self, position: int, step: int | None) -> None:
        """Row ``position`` speaks next at ``step`` (None: not before it is told again): a batch
        that restarts its own rows (worker/engine/shared_rows.py) says so, so a complete step
        still goes at once."""
        self._first_step[position] = NEVER if step is None else step

    def _step_done(self) -> None:
        """The step is complete: hold it, or send it with every step held before it."""
        self._decided = True
        if self._tokens:
            self._held.append((self._step_started, self._tokens))
            self._tokens = []
        now = time.monotonic()
        if self._urgent or now - self._sent_at >= self._coalesce:
            self.flush(now)
        self._urgent = False

    def flush(self, now: float | None = None) -> None:
        """Send every step collected so far (the batch's end sends what is left)."""
        if self._tokens:
            self._held.append((self._step_started, self._tokens))
            self._tokens = []
        if self._held:
            self._send(("steps", self._batch_id, self._held))
            self._held = []
            self._sent_at = time.monotonic() if now is None else now
