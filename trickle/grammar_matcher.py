"""Grammar matchers for one model's vocabulary: llguidance, compiled once per grammar.

The web tier builds each grammar (trickle/grammar.py); the engine process, and the web tier
when it checks that an answer can fit its budget, compile it against the model's own
vocabulary here, keep the compiled matcher in a small LRU cache, and give every use a copy
(``LLMatcher.deep_copy`` costs microseconds, a compile up to a few hundred milliseconds for a
large schema).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import llguidance
import numpy as np
import numpy.typing as npt

from trickle.grammar import parser_limits
from trickle.tokenization import Tokenizer

# How many compiled grammars one engine process keeps (most recently used).
CACHED_GRAMMARS = 64

# The bounds the web tier checked the grammar under: a grammar that needs more to compile or to
# decide one token fails the job instead of stalling the lane.
LIMITS = parser_limits()


class GrammarFailed(ValueError):
    """A grammar the matcher cannot run, or one that reached an error state."""


def grammar_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """The model's vocabulary as llguidance sees it (bytes per id, the end tokens): a Hugging
    Face tokenizer read by llguidance itself from its tokenizer.json, SentencePiece through
    ``token_bytes``."""
    ends = sorted(tokenizer.end_ids) or None
    if tokenizer.huggingface_json is not None:
        return llguidance.LLTokenizer(
            tokenizer.huggingface_json, n_vocab=tokenizer.vocab_size, eos_token=ends
        )
    wrapper = llguidance.TokenizerWrapper(_Vocabulary(tokenizer))
    return llguidance.LLTokenizer(wrapper, eos_token=ends)


class _Vocabulary:
    """What ``llguidance.TokenizerWrapper`` reads: the pieces as bytes, the end and start ids,
    and a tokenize function (text to ids that spell it exactly)."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self.tokens = tokenizer.token_bytes()
        ends = sorted(tokenizer.end_ids)
        self.eos_token_id = ends[0] if ends else tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id if tokenizer.bos_id >= 0 else None
        self.special_token_ids = sorted(tokenizer.special_ids)

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer.encode_text(text)


class MatcherCache:
    """Compiled matchers by grammar string, most recently used kept; thread-safe (one engine
    thread per lane asks)."""

    def __init__(self, tokenizer: Tokenizer, size: int = CACHED_GRAMMARS):
        self.vocabulary = grammar_tokenizer(tokenizer)
        self._size = size
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A fresh matcher for ``grammar``, at its start."""
        with self._lock:
            compiled = self._compiled.get(grammar)
            if compiled is not None:
                self._compiled.move_to_end(grammar)
                return compiled.deep_copy()
        compiled = llguidance.LLMatcher(self.vocabulary, grammar, log_level=0, limits=LIMITS)
        if compiled.is_error():
            raise GrammarFailed(f"the grammar does not compile: {compiled.get_error()}")
        with self._lock:
            self._compiled[grammar] = compiled
            while len(self._compiled) > self._size:
                self._compiled.popitem(last=False)
        return compiled.deep_copy()


def allowed_mask(matcher: llguidance.LLMatcher, vocab_size: int) -> npt.NDArray[np.bool_]:
    """Which ids the grammar allows next (from its bitmask of 32-bit little-endian words)."""
    words = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
    return np.unpackbits(words, bitorder="little")[:vocab_size].astype(bool)
