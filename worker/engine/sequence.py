"""Per-job generation state: turns token ids into released text and decides when the job ends.

Pure logic (no Redis, no CTranslate2), called from the engine callback for every new token.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from trickle.jobs import FinishReason, JobError
from worker.engine.detok import Decoder, IncrementalDetokenizer
from worker.engine.scheduled import TokenOutcome
from worker.engine.stops import StopMatcher


class SequenceState:
    """One job's ``SequenceView`` (worker.engine.scheduled): what the scheduler's lanes feed
    tokens to and what the job's result is read from."""

    def __init__(
        self,
        decoder: Decoder,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        stop: Sequence[str],
        end_ids: Collection[int],
        resumed_text: str = "",
        resumed_count: int = 0,
    ):
        """``max_new_tokens`` counts the whole job; a resumed job starts with what it had
        already streamed before its previous worker died (``prompt_ids`` then cover both).
        ``end_ids``: the tokens that end the job (end tokens, stop_token_ids); never emitted."""
        self._detok = IncrementalDetokenizer(decoder, prompt_ids)
        self._stops = StopMatcher(stop)
        self._max_new_tokens = max_new_tokens
        self._end_ids = frozenset(end_ids)
        self._parts: list[str] = [resumed_text] if resumed_text else []
        self.count = resumed_count
        self.finish_reason: FinishReason | None = None
        self.stop_sequence = ""  # the stop string that ended it, if one did
        self.error: JobError | None = None
        # Set from other threads (a cancel, a deadline, a lost lease); read on the engine thread.
        self._stop_reason: FinishReason | None = None

    def request_stop(self, reason: FinishReason, error: JobError | None = None) -> None:
        """Ask the engine to end this sequence at its next token (thread-safe)."""
        if self._stop_reason is None:
            self.error = error
            self._stop_reason = reason

    @property
    def stop_requested(self) -> FinishReason | None:
        return self._stop_reason

    @property
    def output(self) -> str:
        return "".join(self._parts)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def on_token(self, token_id: int, is_last: bool) -> TokenOutcome:
        """Account for one generated token; the end-of-sequence token counts and flushes text."""
        if self.finished:
            return TokenOutcome(None, "", self.finish_reason)
        if self._stop_reason is not None:
            self.finish_reason = self._stop_reason
            return TokenOutcome(None, "", self.finish_reason)
        index = self.count
        self.count += 1
        if token_id in self._end_ids:
            text = self._release_rest()
            reason: FinishReason | None = FinishReason.STOP
        else:
            check = self._stops.feed(self._detok.add(token_id))
            text = check.released
            reason = FinishReason.STOP if check.stopped else None
            self._note_stop(check.stop)
            if reason is None and (is_last or self.count >= self._max_new_tokens):
                text += self._release_rest()
                reason = self.finish_reason or FinishReason.LENGTH
        if reason is not None and self.finish_reason is None:
            self.finish_reason = reason
        self._parts.append(text)
        return TokenOutcome(index, text, self.finish_reason)

    def finish_without_token(self, reason: FinishReason) -> None:
        """End the job outside the token path (cancel seen after the last step, engine failure)."""
        if self.finish_reason is None:
            self.finish_reason = reason

    def _release_rest(self) -> str:
        """Flush the detokenizer through the stop matcher; a stop found here still ends as stop."""
        check = self._stops.feed(self._detok.flush())
        if check.stopped:
            self._note_stop(check.stop)
            self.finish_reason = FinishReason.STOP
            return check.released
        return check.released + self._stops.flush()

    def _note_stop(self, stop: str) -> None:
        """Remember the stop string that ends the job (the first to end it, only)."""
        if stop and self.finish_reason is None:
            self.stop_sequence = stop
