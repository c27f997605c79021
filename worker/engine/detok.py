"""Incremental detokenization with prefix/read offsets (the Text Generation Inference scheme).

Decoding each token alone loses SentencePiece's word-boundary spaces and splits multi-byte UTF-8
characters encoded as byte-fallback pieces. Instead we decode a short window of ids twice and emit
only the new suffix, holding it back while it ends in U+FFFD (an incomplete character).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

# How many prompt ids to keep as context so the first generated piece keeps its leading space.
PROMPT_CONTEXT_IDS = 5
REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: list[int]) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, decoder: Decoder, prompt_ids: Sequence[int] = ()):
        self._decoder = decoder
        self._ids: list[int] = list(prompt_ids[-PROMPT_CONTEXT_IDS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def add(self, token_id: int) -> str:
        """Append one id; return the text it completes (possibly empty)."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """Text still held at the end of generation (an incomplete character stays as U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        prefix_text = self._decoder.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decoder.decode(self._ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and (final or not new_text.endswith(REPLACEMENT_CHAR)):
            if not new_text.startswith(prefix_text):
                # Decoding merged across the boundary; emit from the first differing character.
                common = _common_prefix_length(prefix_text, new_text)
                delta = new_text[common:]
            else:
                delta = new_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            self._trim()
            return delta
        return ""

    def _trim(self) -> None:
        # Keep the window small: ids before prefix_offset are never decoded again.
        if self._prefix_offset > 64:
            drop = self._prefix_offset
            self._ids = self._ids[drop:]
            self._prefix_offset -= drop
            self._read_offset -= drop


def _common_prefix_length(a: str, b: str) -> int:
    length = 0
    for char_a, char_b in zip(a, b, strict=False):
        if char_a != char_b:
            break
        length += 1
    return length
