"""A second byte-level BPE encoder, written out plainly from tokenizer.json's merges: the
oracle the ``tokenizers`` library is checked against (GPT-2's algorithm: split the text with
the pre-tokenizer's pattern, map each byte to its printable character, then apply the
lowest-ranked merge until none applies; added tokens are cut out first, and digits split one
by one first where the pre-tokenizer says so, as SmolLM2's and StarCoder's do)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import regex

from trickle.tokenization.piece_bytes import unicode_to_byte

# The ByteLevel pre-tokenizer's pattern (GPT-2's), as the tokenizers library writes it.
GPT2_PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)
# The Digits pre-tokenizer with individual_digits: every numeric character alone.
DIGIT = regex.compile(r"(\p{N})")


class ReferenceBPE:
    def __init__(self, path: Path):
        spec = json.loads(path.read_text(encoding="utf-8"))
        model = spec["model"]
        pre = json.dumps(spec["pre_tokenizer"])
        if model["type"] != "BPE" or "ByteLevel" not in pre:
            raise ValueError("the reference encodes byte-level BPE only")
        self.digits_apart = '"individual_digits": true' in pre
        self.vocab: dict[str, int] = model["vocab"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        self.ranks = {pair: rank for rank, pair in enumerate(merges)}
        self.added = {token["content"]: token["id"] for token in spec["added_tokens"]}
        self.added_pattern = regex.compile(
            "(" + "|".join(regex.escape(t) for t in sorted(self.added, key=len, reverse=True)) + ")"
        )
        self.to_char = {byte: char for char, byte in unicode_to_byte().items()}

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part in self.added_pattern.split(text) if self.added else [text]:
            if part in self.added:
                ids.append(self.added[part])
            elif part:
                for chunk in DIGIT.split(part) if self.digits_apart else [part]:
                    for word in GPT2_PATTERN.findall(chunk):
                        ids.extend(self.vocab[piece] for piece in self._merge(word))
        return ids

    def _merge(self, word: str) -> list[str]:
        parts = [self.to_char[byte] for byte in word.encode("utf-8")]
        while len(parts) > 1:
            pairs = [
                (self.ranks.get(pair, 1 << 62), i)
                for i, pair in enumerate(itertools.pairwise(parts))
            ]
            rank, at = min(pairs)
            if rank == 1 << 62:
                break
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        return parts
