"""What constrained jobs share in one engine process: compiled matchers and the closer, built
at the first constrained job, and each job's ``ConstrainedRun`` made from a batch command."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trickle.closure import Closer
from trickle.grammar_matcher import MatcherCache
from trickle.tokenization import Tokenizer
from worker.engine.alternatives import Scores
from worker.engine.batch_command import BatchCommand
from worker.engine.constrained import ConstrainedRun, Sampling, replay


@dataclass(frozen=True)
class GrammarTools:
    """Compiled matchers (an LRU per grammar) and the closing search, for the vocabulary."""

    matchers: MatcherCache
    closer: Closer


class GrammarRuns:
    """The engine process's grammar tools, shared by its lanes."""

    def __init__(self, tokenizer: Tokenizer, end_tokens: list[int], scores: Scores):
        self._tokenizer = tokenizer
        self._end_tokens = frozenset(end_tokens)
        self._scores = scores
        self._lock = threading.Lock()
        self._tools: GrammarTools | None = None

    def run(
        self, command: BatchCommand, row: int, grammar: str, to_piece: Callable[[int], str]
    ) -> ConstrainedRun:
        """Row ``row``'s grammar run: its matcher (past what it streamed before a resume) and
        the command's sampling."""
        tools = self._grammar_tools()
        matcher = tools.matchers.matcher(grammar)
        replays = command.grammar_replays
        replay(matcher, self._tokenizer.encode_text(replays[row] if replays else ""))
        sampling = Sampling(
            greedy=command.top_k == 1,
            temperature=command.temperature,
            top_k=command.top_k,
            top_p=command.top_p,
            repetition_penalty=command.repetition_penalty,
            min_tokens=command.min_tokens,
            rng=np.random.default_rng(command.seed),
        )
        return ConstrainedRun(
            matcher,
            tools.closer,
            to_piece,
            self._end_tokens,
            self._tokenizer.vocab_size,
            sampling,
            self._scores.for_job(command.alternatives(row), command.top_k, command.temperature),
        )

    def _grammar_tools(self) -> GrammarTools:
        """The model's vocabulary for grammars, built at the first constrained job."""
        with self._lock:
            if self._tools is None:
                cache = MatcherCache(self._tokenizer)
                self._tools = GrammarTools(cache, Closer(self._tokenizer.token_bytes()))
            return self._tools
