"""Incremental detokenization with the real demo tokenizer, byte-fallback pieces included."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trickle.tokenization.sentencepiece_tokenizer import SentencePieceTokenizer
from worker.engine.detok import IncrementalDetokenizer

TEXTS = [
    "Return the number of items in a container.",
    "  leading spaces and\ttabs, then trailing  ",
    "héllo wörld ☃ 日本語 🎉 emoji, naïve café",
    "🎉🎉🎉",
    "line one\nline two\n\nline four",
]


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> SentencePieceTokenizer:
    return SentencePieceTokenizer(demo_model_dir / "tokenizer.model")


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_pieces_equal_full_decode(tokenizer: SentencePieceTokenizer, text: str) -> None:
    ids = tokenizer.encode(text)[1:]  # drop <s>: decode it as generated text
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add(token_id) for token_id in ids] + [detok.flush()]
    assert "".join(pieces) == tokenizer.decode(ids)
    assert all("\ufffd" not in piece for piece in pieces), pieces


def test_multibyte_characters_use_byte_fallback(tokenizer: SentencePieceTokenizer) -> None:
    # The demo vocabulary has no piece for these characters: they arrive as several byte pieces.
    ids = tokenizer.encode("🎉")[1:]
    assert len([p for p in tokenizer.to_pieces(ids) if p.startswith("<0x")]) == 4
    detok = IncrementalDetokenizer(tokenizer)
    emitted = [detok.add(token_id) for token_id in ids]
    # Nothing is released until the fourth byte completes the character.
    assert all(piece == "" for piece in emitted[:-1])
    assert emitted[-1].strip() == "🎉"


def test_prompt_context_keeps_the_leading_space(tokenizer: SentencePieceTokenizer) -> None:
    prompt = tokenizer.encode("The value")
    continuation = tokenizer.encode("The value of the")[len(prompt) :]
    detok = IncrementalDetokenizer(tokenizer, prompt)
    text = "".join(detok.add(token_id) for token_id in continuation) + detok.flush()
    assert text == " of the"


def test_incomplete_character_at_the_end_is_flushed_as_replacement(
    tokenizer: SentencePieceTokenizer,
) -> None:
    ids = tokenizer.encode("🎉")[1:]
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.add(token_id) for token_id in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.flush().endswith("\ufffd")


def test_ids_beyond_the_tokenizer_decode_as_unknown(tokenizer: SentencePieceTokenizer) -> None:
    # A model with a padded vocabulary may emit ids the tokenizer has no piece for.
    assert tokenizer.decode([tokenizer.vocab_size + 5]) == tokenizer.decode([0])
    assert tokenizer.to_pieces([tokenizer.vocab_size]) == ["<unk>"]


LIGATURE_PIECES = {1: "x", 2: "yy", 3: "b", 4: "d", 5: "\ufffd"}


class Ligatures:
    """A decoder whose text is not prefix-stable: "yb" decodes as "Z" (like pieces that merge)."""

    def decode(self, ids: list[int]) -> str:
        return "".join(LIGATURE_PIECES[i] for i in ids).replace("yb", "Z")


def test_text_that_merges_across_the_boundary_is_emitted_from_the_first_difference() -> None:
    detok = IncrementalDetokenizer(Ligatures())
    # "yy" then "b": the window decodes to "yZ", no longer than "yy": nothing new yet.
    assert [detok.add(i) for i in (1, 2, 3, 4)] == ["x", "yy", "", "Zd"]
    assert detok.flush() == ""


def test_an_incomplete_character_is_held_until_completed_or_flushed() -> None:
    detok = IncrementalDetokenizer(Ligatures())
    assert detok.add(1) == "x"
    assert detok.add(5) == ""  # ends in U+FFFD: may still become a character
    assert detok.add(4) == "\ufffdd"
    assert detok.add(5) == ""
    assert detok.flush() == "\ufffd"
    assert detok.flush() == ""


def test_a_long_stream_keeps_decoding_right_past_the_window_trim(
    tokenizer: SentencePieceTokenizer,
) -> None:
    text = " ".join(TEXTS) * 8  # several hundred ids: the window is trimmed many times
    ids = tokenizer.encode(text)[1:]
    assert len(ids) > 300
    detok = IncrementalDetokenizer(tokenizer)
    assert "".join(detok.add(i) for i in ids) + detok.flush() == tokenizer.decode(ids)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 1999), max_size=12))
def test_the_tokenizers_decoder_is_sentencepieces_decode(
    tokenizer: SentencePieceTokenizer, ids: list[int]
) -> None:
    """``SentencePieceTokenizer.decode`` may call SentencePiece's C++ decoder directly
    (skipping its Python wrapper's checks): it must give exactly what ``decode`` gives,
    byte-fallback pieces too."""
    assert tokenizer.decode(ids) == tokenizer._sp.decode(ids)
