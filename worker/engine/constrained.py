"""Grammar-constrained decoding on CTranslate2, which has no logits processor.

A constrained job runs alone on its calls here; several share a batch through
worker/engine/shared_rows.py, which maps the batched logits to their rows, while the model's
measured refusals let sharing pay (worker/engine/sharing_gate.py).

Each token CTranslate2 proposes is checked by the job's llguidance matcher inside the step
callback, before it is sent anywhere:
- accepted: it goes to the worker like any token;
- rejected: the callback stops the call at once, and the token never leaves this process. The
  step's logits (before temperature) give the replacement: the allowed token with the highest
  logit when greedy, else one drawn from the allowed ones with the job's temperature, top-k and
  top-p (exactly the masked distribution). Then the tokens the grammar forces after it
  (llguidance's fast-forward: keys, ``:``, the rest of a literal) are appended without a model
  step, and the next call starts from the prompt plus everything accepted.

A refused end token is the model saying it is done before the grammar is: the answer then
closes with the shortest completion (``closure.Closer``) and ends there, as the model meant,
instead of being steered on to ``max_tokens``. The converse: a refused token where the grammar
may end is the model writing past the structure, and the answer ends there too (its end token,
min_tokens allowing), instead of being steered into more structure it did not ask for (the
next of several allowed tool calls, say: SmolLM2 wrote the same forced call until
``max_tokens``, each time after the newline it meant as its line's end).

So a reader only ever sees accepted tokens, the streamed text is the stored text, and greedy
output stays deterministic. Near ``max_tokens`` a token that would leave too little room to
close the structure is refused too, and the answer ends with ``closure.Closer``'s completion;
it then ends as cut (``length``), so the client knows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import llguidance
import numpy as np
import numpy.typing as npt

from trickle.closure import Closer
from trickle.grammar_matcher import GrammarFailed, allowed_mask
from worker.engine.alternatives import row_logits
from worker.engine.request import Logprob
from worker.engine.sampling import apply_repetition_penalty, sample_token

# Within this many tokens of the closing completion's length from max_tokens, every token is
# checked for room to close (a deep copy and a closing search each); further away, the length
# is refreshed every REFRESH_EVERY accepted tokens.
CLOSING_MARGIN = 64
REFRESH_EVERY = 16

# (token id, log-probability, is last) -> stop: the job's next token, to its stream.
TokenSink = Callable[[int, Logprob, bool], bool]
# (step, its row's logits when read) -> what an accepted token reports (alternatives.Scores).
Scorer = Callable[[Any, Callable[[], "npt.NDArray[np.float64] | None"]], Logprob]
# (prompt pieces, max new tokens, min new tokens, callback): one generate_batch of one row.
GenerateCall = Callable[[list[str], int, int, Callable[[Any], bool]], None]


@dataclass(frozen=True)
class Sampling:
    """How the replacement for a rejected token is chosen (the job's own decoding options)."""

    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    min_tokens: int
    rng: np.random.Generator


@dataclass
class RowCall:
    """What one generate call left: the ids it accepted, and the rejected step's logits."""

    accepted: list[int] = field(default_factory=list)
    rejected: bool = False
    closing: bool = False
    logits: npt.NDArray[np.float64] | None = None
    refused_end: int | None = None  # the model ended before the grammar could
    ended: bool = False  # the job ended (its last token, or the worker stopped it)


class ConstrainedRun:
    """One constrained job in the engine process: its matcher, budget and step count."""

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        closer: Closer,
        to_piece: Callable[[int], str],
        end_ids: frozenset[int],
        vocab_size: int,
        sampling: Sampling,
        score: Scorer | None = None,
    ):
        self._matcher = matcher
        self._closer = closer
        self._to_piece = to_piece
        self._end_ids = end_ids
        self._vocab_size = vocab_size
        self._sampling = sampling
        self._score = score or (lambda step, logits: step.log_prob)  # an accepted token's
        self._generated: list[int] = []
        self._closing_length = 0
        self._since_refresh = REFRESH_EVERY
        self._left = 0  # tokens the budget has left after those emitted
        # A completion from the matcher's state, once known: near the end each token is
        # checked against it first (one copy), before any search.
        self._escape: list[int] | None = None
        self._pending: list[int] | None = None  # the escape after the token being checked
        # No completion from the matcher's state fits the budget (a full search found none):
        # closing cannot help then, so the model writes on unchecked until one is found again.
        self._hopeless = False
        self.calls = 0  # generate calls: 1 + the restarts its refused tokens cost
        # Tokens the model proposed, and those refused that cost the row its call (the refusal
        # rate worker/engine/sharing_gate.py decides by; a refused end closes, never restarts).
        self.proposed = 0
        self.refused = 0

    def run(self, prompt: list[str], max_new: int, generate: GenerateCall, sink: TokenSink) -> None:
        """Generate up to ``max_new`` tokens after ``prompt``, every one of them accepted (alone
        on its call: each refusal restarts it)."""
        pieces = list(prompt)
        self._left = max_new
        while self._left > 0:
            call = RowCall()
            owed = max(0, self._sampling.min_tokens - len(self._generated))
            self.calls += 1
            generate(pieces, self._left, owed, self._callback(call, sink))
            pieces.extend(self._to_piece(token) for token in call.accepted)
            forced = self.settle(call, sink)
            if forced is None:
                return
            pieces.extend(self._to_piece(token) for token in forced)

    def start(self, max_new: int) -> None:
        """Set the budget of a run driven call by call (worker/engine/shared_rows.py)."""
        self._left = max_new

    @property
    def left(self) -> int:
        """Tokens the budget has left after those emitted."""
        return self._left

    def settle(self, call: RowCall, sink: TokenSink) -> list[int] | None:
        """After ``call`` stopped (or ended): emit the refused token's replacement and what the
        grammar forces after it, or the closing completion; the tokens emitted, or None when
        the job is over (it ended, or nothing is left to generate)."""
        left = self._left
        if call.ended or not (call.rejected or call.closing) or left <= 0:
            return None
        closing = call.closing
        if call.refused_end is not None:
            forced = self._ending(call.refused_end, left)
            closing = forced[-1:] != [call.refused_end]  # no room for the end: cut
        elif closing:
            forced = self._closing(left)
        else:
            forced = self._replacement(call.logits)
            if not self._leaves_room(forced, left):
                closing, forced = True, self._closing(left)
        forced = forced[:left]
        if not forced:
            return None  # complete already: the batch's end finishes the job as cut
        for i, token in enumerate(forced):
            last = i == len(forced) - 1 and (closing or token in self._end_ids)
            if self._emit(sink, token, None, last or left - i == 1):
                return None
        return forced if self._left > 0 else None

    def _callback(self, call: RowCall, sink: TokenSink) -> Callable[[Any], bool]:
        def on_step(step: Any) -> bool:
            return self.on_token(call, step, lambda: row_logits(step), sink)

        return on_step

    def on_token(
        self,
        call: RowCall,
        step: Any,
        logits: Callable[[], npt.NDArray[np.float64] | None],
        sink: TokenSink,
    ) -> bool:
        """One token CTranslate2 proposed for this job (``logits``: its row's, read only when
        needed); True stops the job's row: refused (``settle`` then picks what follows), or
        ended."""
        token = int(step.token_id)
        self.proposed += 1
        room = self._left - 1  # tokens left after this one
        self._pending = None
        checked = not self._hopeless and room < self._closing_length + CLOSING_MARGIN
        if checked and not self._fits(token, room):
            call.closing = True
            return True
        if not self._consume(token):
            call.rejected = True
            call.logits = logits()
            if token in self._end_ids:
                call.refused_end = token
            else:
                self.refused += 1
            return True
        call.accepted.append(token)
        self._since_refresh += 1
        self._advance_escape(token, self._pending)
        stop = self._emit(sink, token, self._score(step, logits), bool(step.is_last), consumed=True)
        call.ended = stop
        return stop

    def _leaves_room(self, forced: list[int], left: int) -> bool:
        """Whether after ``forced`` the structure can still close within ``left`` tokens (the
        way out found becomes the escape, so the next token's check starts from it instead of
        searching again: a search from a later state may not find what this one found)."""
        probe = self._matcher.deep_copy()
        text = [t for t in forced if t not in self._end_ids]
        if probe.try_consume_tokens(text) < len(text):
            return True  # (an end token among them ends the answer complete)
        way_out = self._way_out(probe, left - len(forced), None)
        if way_out is None:
            return self._no_way_out(left)
        self._escape = [*forced, *way_out]  # emitting ``forced`` advances it
        return True

    def _no_way_out(self, left: int) -> bool:
        """Whether no completion from the matcher's state fits ``left`` tokens (a full search,
        once: closing then would end the answer empty or where it stands, so it goes on)."""
        if not self._hopeless:
            self._hopeless = self._completion(left) is None
        return self._hopeless

    def _consume(self, token: int) -> bool:
        """Advance the matcher past ``token`` if the grammar allows it (else leave it as it
        was). An end token is allowed once the grammar accepts; llguidance takes it only
        through ``consume_token``, which would leave the matcher broken on any refused one.
        An id past the tokenizer's pieces (a padded output layer) is never allowed."""
        matcher = self._matcher
        if token >= self._vocab_size:
            return False
        if token in self._end_ids:
            return matcher.is_accepting() and matcher.consume_token(token)
        return matcher.try_consume_tokens([token]) == 1

    def _fits(self, token: int, room: int) -> bool:
        """Whether after ``token`` the structure can still close within ``room`` tokens (and
        refresh the closing length every token this close to the end)."""
        if token in self._end_ids or token >= self._vocab_size:
            return True  # an end (if allowed) leaves the answer complete; the other is refused
        probe = self._matcher.deep_copy()
        if probe.try_consume_tokens([token]) != 1:
            return True  # rejected anyway: the rejection path picks an allowed token
        way_out = self._way_out(probe, room, token)
        if way_out is None:  # no way to close after it within the room: close now instead,
            return self._no_way_out(room + 1)  # where closing from here can
        self._closing_length = len(way_out)
        self._pending = way_out
        return True

    def _way_out(
        self, probe: llguidance.LLMatcher, room: int, token: int | None
    ) -> list[int] | None:
        """A completion from ``probe`` (the state after ``token``) within ``room`` tokens: the
        known escape when it still works there, else a quick search; None when neither finds
        one (the caller then closes from where it stands, as the escape there fits)."""
        escape = self._escape
        if escape and token is not None and escape[0] == token:
            return escape[1:] if len(escape) - 1 <= room else None
        if escape and len(escape) <= room:
            trial = probe.deep_copy()
            if trial.try_consume_tokens(escape) == len(escape) and trial.is_accepting():
                return escape
        return self._closer.closing(probe, room, quick=True)

    def _advance_escape(self, token: int, known: list[int] | None) -> None:
        """The escape after ``token`` was taken: ``known`` when the room check found one, the
        rest of the escape when the token was its first, else unknown."""
        escape = self._escape
        if known is not None:
            self._escape = known
        elif escape and escape[0] == token:
            self._escape = escape[1:]
        else:
            self._escape = None

    def _emit(
        self, sink: TokenSink, token: int, logprob: Logprob, last: bool, consumed: bool = False
    ) -> bool:
        """Send one token to the worker (consuming it in the matcher unless done already)."""
        if not consumed:
            if not self._consume(token):
                raise GrammarFailed(f"the grammar refused its own forced token {token}")
            self._advance_escape(token, None)
        self._generated.append(token)
        self._left -= 1
        if self._since_refresh >= REFRESH_EVERY:
            self._since_refresh = 0
            self._escape = self._completion(self._left)
            # No way out known within the budget: closing now would end the answer empty or
            # cut where it stands, so the model writes on and only the last tokens are checked.
            self._closing_length = 0 if self._escape is None else len(self._escape)
            self._hopeless = self._escape is None
        return sink(token, logprob, last or token in self._end_ids)

    def _ending(self, end: int, left: int) -> list[int]:
        """The model ended before the grammar could: a completion, then its end token when
        both fit (else the completion alone, and the answer ends as cut)."""
        closing = self._completion(left - 1)
        return self._closing(left) if closing is None else [*closing, end]

    def _closing(self, left: int) -> list[int]:
        """A completion within ``left`` tokens (one was there when the last token was taken:
        every token near the end is checked for room)."""
        return self._completion(left) or []

    def _completion(self, limit: int) -> list[int] | None:
        """The escape if it fits ``limit``, else one searched for from the matcher's state."""
        if self._escape is not None and len(self._escape) <= limit:
            return self._escape
        return self._closer.closing(self._matcher, limit)

    def _replacement(self, logits: npt.NDArray[np.float64] | None) -> list[int]:
        """The best allowed token for the rejected step, then what the grammar forces."""
        allowed = allowed_mask(self._matcher, self._vocab_size)
        sampling = self._sampling
        ends = [i for i in self._end_ids if i < len(allowed)]
        if len(self._generated) < sampling.min_tokens and not allowed[ends].all():
            allowed[ends] = False  # (a complete answer with nothing else allowed still ends)
        candidates = np.flatnonzero(allowed)
        if not len(candidates):
            raise GrammarFailed("the grammar allows no token here")
        allowed_ends = [i for i in ends if allowed[i]]
        if allowed_ends and self._matcher.is_accepting():
            # The model wrote past a structure that may end here: it ends (its likeliest end).
            return [max(allowed_ends, key=lambda i: -np.inf if logits is None else logits[i])]
        if logits is None:
            choice = int(candidates[0])
        else:
            scores = apply_repetition_penalty(
                logits[: self._vocab_size], self._generated, sampling.repetition_penalty
            )[candidates]
            if sampling.greedy:
                choice = int(candidates[int(np.argmax(scores))])
            else:
                drawn = sample_token(
                    scores, sampling.temperature, sampling.top_k, sampling.top_p, sampling.rng
                )
                choice = int(candidates[drawn])
        probe = self._matcher.deep_copy()
        probe.try_consume_tokens([choice])
        return [choice, *probe.compute_ff_tokens()]


def replay(matcher: llguidance.LLMatcher, ids: Sequence[int]) -> None:
    """Move a fresh matcher past what a resumed job had already streamed."""
    if ids and matcher.try_consume_tokens(list(ids)) != len(ids):
        raise GrammarFailed("the text streamed before the resume does not match the grammar")
