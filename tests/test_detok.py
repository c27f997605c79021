"""Incremental detokenization with the real demo tokenizer, byte-fallback pieces included."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.detok import IncrementalDetokenizer
from worker.tokenizer import Tokenizer

TEXTS = [
    "Return the number of items in a container.",
    "  leading spaces and\ttabs, then trailing  ",
    "héllo wörld ☃ 日本語 🎉 emoji, naïve café",
    "🎉🎉🎉",
    "line one\nline two\n\nline four",
]


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> Tokenizer:
    return Tokenizer(demo_model_dir / "tokenizer.model")


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_pieces_equal_full_decode(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)[1:]  # drop <s>: decode it as generated text
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add(token_id) for token_id in ids] + [detok.flush()]
    assert "".join(pieces) == tokenizer.decode(ids)
    assert all("\ufffd" not in piece for piece in pieces), pieces


def test_multibyte_characters_use_byte_fallback(tokenizer: Tokenizer) -> None:
    # The demo vocabulary has no piece for these characters: they arrive as several byte pieces.
    ids = tokenizer.encode("🎉")[1:]
    assert len([p for p in tokenizer.to_pieces(ids) if p.startswith("<0x")]) == 4
    detok = IncrementalDetokenizer(tokenizer)
    emitted = [detok.add(token_id) for token_id in ids]
    # Nothing is released until the fourth byte completes the character.
    assert all(piece == "" for piece in emitted[:-1])
    assert emitted[-1].strip() == "🎉"


def test_prompt_context_keeps_the_leading_space(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode("The value")
    continuation = tokenizer.encode("The value of the")[len(prompt) :]
    detok = IncrementalDetokenizer(tokenizer, prompt)
    text = "".join(detok.add(token_id) for token_id in continuation) + detok.flush()
    assert text == " of the"


def test_incomplete_character_at_the_end_is_flushed_as_replacement(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("🎉")[1:]
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.add(token_id) for token_id in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.flush().endswith("\ufffd")


def test_ids_beyond_the_tokenizer_decode_as_unknown(tokenizer: Tokenizer) -> None:
    # A model with a padded vocabulary may emit ids the tokenizer has no piece for.
    assert tokenizer.decode([tokenizer.vocab_size + 5]) == tokenizer.decode([0])
    assert tokenizer.to_pieces([tokenizer.vocab_size]) == ["<unk>"]
