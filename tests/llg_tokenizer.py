"""An llguidance tokenizer over a SentencePiece model, for tests that run grammars against the
demo model's real vocabulary (byte-fallback pieces as their byte, ``▁`` as a space, control
pieces as special tokens)."""

from __future__ import annotations

from pathlib import Path

import llguidance
import sentencepiece as spm

SPACE = "\u2581"


class _Vocabulary:
    """What ``llguidance.TokenizerWrapper`` reads from a tokenizer."""

    def __init__(self, path: Path):
        self._sp = spm.SentencePieceProcessor(model_file=str(path))
        self.eos_token_id = self._sp.eos_id()
        self.bos_token_id = self._sp.bos_id()
        self.tokens: list[bytes] = []
        self.special_token_ids: list[int] = []
        for index in range(self._sp.get_piece_size()):
            piece = self._sp.id_to_piece(index)
            if self._sp.is_control(index) or self._sp.is_unknown(index):
                self.tokens.append(b"")
                self.special_token_ids.append(index)
            elif self._sp.is_byte(index):
                self.tokens.append(bytes([int(piece[3:5], 16)]))
            else:
                self.tokens.append(piece.replace(SPACE, " ").encode())

    def __call__(self, text: str) -> list[int]:
        ids: list[int] = self._sp.encode(text, out_type=int)
        return ids


def llg_tokenizer(path: Path) -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocabulary(path)))


def matches(tokenizer: llguidance.LLTokenizer, grammar: str, text: str) -> bool:
    """Whether ``text`` (cut into the vocabulary's longest pieces: SentencePiece's own cut puts
    a space before the text) is a whole answer the grammar accepts, the end token included."""
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    tokens = [*tokenizer.greedy_tokenize(text), tokenizer.eos_token]
    return matcher.consume_tokens(tokens) and not matcher.is_error()
