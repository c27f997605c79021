"""The bytes a Hugging Face tokenizer's vocabulary string stands for, by its decoder's family.

``tokenizers`` decodes whole sequences; a grammar matcher, the logprobs' alternatives and the
closer need each id's bytes alone, exactly as the decoder would join them. Two families cover
the models Trickle serves:

- byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM2: a ``ByteLevel`` decoder): each character of a
  vocabulary string is one byte, through GPT-2's byte-to-unicode table;
- SentencePiece-style (Llama 2, Mistral's tokenizer.json: ``Metaspace``, or ``Replace`` of
  ``\u2581`` by a space, with ``ByteFallback``): ``\u2581`` is a space and ``<0xAB>`` one byte.

A decoder of neither family spells each string as its own UTF-8.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

SPACE = "\u2581"
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.cache
def unicode_to_byte() -> dict[str, int]:
    """GPT-2's table, reversed: printable bytes stand for themselves, the other 68 bytes for
    the characters from U+0100 on, in byte order (``bytes_to_unicode`` in GPT-2's encoder)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(byte): byte for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in printable:
            table[chr(256 + extra)] = byte
            extra += 1
    return table


# Each byte-level character to the character of its byte's value, so that ``str.translate``
# then ``encode("latin-1")`` gives the bytes (a vocabulary of 49,152 strings in a few ms).
_TO_LATIN1 = {ord(char): byte for char, byte in unicode_to_byte().items()}
_BYTE_LEVEL_CHARS = frozenset(unicode_to_byte())


@dataclass(frozen=True)
class Spelling:
    """How a decoder spells each vocabulary string (``spell``), and for the SentencePiece-style
    family whether it drops the text's first space (Llama 2's ``Strip``, ``Metaspace``'s
    prepended space): that family's text is then the ids' bytes joined, decoded once."""

    spell: Callable[[str], bytes]
    sentencepiece_style: bool = False
    strips_first_space: bool = False


def speller(decoder: dict[str, Any] | None) -> Spelling:
    """How the decoder described by tokenizer.json's ``decoder`` spells one vocabulary string."""
    steps = list(_flatten(decoder))
    kinds = {step.get("type") for step in steps}
    if "ByteLevel" in kinds:
        return Spelling(_byte_level)
    spaces = "Metaspace" in kinds or any(_replaces_space(step) for step in steps)
    byte_fallback = "ByteFallback" in kinds

    def spell(piece: str) -> bytes:
        if byte_fallback:
            byte = _BYTE_PIECE.fullmatch(piece)
            if byte:
                return bytes([int(byte.group(1), 16)])
        return (piece.replace(SPACE, " ") if spaces else piece).encode()

    strips = any(_strips_first_space(step) for step in steps)
    return Spelling(spell, spaces or byte_fallback, strips)


def _byte_level(piece: str) -> bytes:
    if not _BYTE_LEVEL_CHARS.issuperset(piece):  # not a byte-level string: its own text
        return piece.encode()
    return piece.translate(_TO_LATIN1).encode("latin-1")


def _flatten(decoder: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
    if not decoder:
        return
    if decoder.get("type") == "Sequence":
        for step in decoder.get("decoders", []):
            yield from _flatten(step)
    else:
        yield decoder


def _strips_first_space(step: dict[str, Any]) -> bool:
    if step.get("type") == "Strip":
        return step.get("content") == " " and int(step.get("start") or 0) >= 1
    if step.get("type") == "Metaspace":
        scheme = step.get("prepend_scheme")
        return scheme in ("first", "always") if scheme else bool(step.get("add_prefix_space"))
    return False


def _replaces_space(step: dict[str, Any]) -> bool:
    pattern = step.get("pattern") or {}
    return step.get("type") == "Replace" and pattern.get("String") == SPACE
