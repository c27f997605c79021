"""A SentencePiece-style tokenizer.json (Llama 2's layout: byte fallback, ``▁`` spaces, the first
space stripped) behind the Hugging Face implementation, against SentencePiece itself: the demo
tokenizer converted (tests/bpe_tokenizer.py) must encode, spell and decode every id as the
SentencePiece model does, invalid UTF-8 included, and stream the decode of all its ids."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.bpe_tokenizer import MULTILINGUAL, write_sentencepiece_style
from trickle.tokenization.huggingface_tokenizer import HuggingFaceTokenizer
from trickle.tokenization.sentencepiece_tokenizer import SentencePieceTokenizer
from worker.engine.detok import IncrementalDetokenizer

TEXTS = [
    *MULTILINGUAL,
    "Return the number of items in a container.",
    "  two  leading spaces, a\ttab and a trailing one ",
    "🎉🎉",
]


@pytest.fixture(scope="module")
def sentencepiece(demo_model_dir: Path) -> SentencePieceTokenizer:
    return SentencePieceTokenizer(demo_model_dir / "tokenizer.model")


@pytest.fixture(scope="module")
def converted(
    demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> HuggingFaceTokenizer:
    path = write_sentencepiece_style(
        demo_model_dir / "tokenizer.model", tmp_path_factory.mktemp("sp-style") / "tokenizer.json"
    )
    return HuggingFaceTokenizer(path, True, "<s>", "</s>")


def test_special_ids_and_vocabulary_agree(
    sentencepiece: SentencePieceTokenizer, converted: HuggingFaceTokenizer
) -> None:
    assert (converted.bos_id, converted.eos_id, converted.unk_id) == (
        sentencepiece.bos_id,
        sentencepiece.eos_id,
        sentencepiece.unk_id,
    )
    assert converted.special_ids == sentencepiece.special_ids
    every = list(range(sentencepiece.vocab_size))
    assert converted.to_pieces(every) == sentencepiece.to_pieces(every)
    assert converted.token_bytes() == sentencepiece.token_bytes()


@pytest.mark.parametrize("text", TEXTS)
def test_encoding_and_decoding_agree(
    sentencepiece: SentencePieceTokenizer, converted: HuggingFaceTokenizer, text: str
) -> None:
    ids = sentencepiece.encode(text)
    assert converted.encode(text) == ids
    assert converted.decode(ids) == sentencepiece.decode(ids) == text
    assert converted.encode_text(text) == sentencepiece.encode_text(text)


@settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=300, deadline=None
)
@given(st.lists(st.integers(1, 1999), max_size=20))
def test_any_ids_decode_and_stream_as_sentencepiece(
    sentencepiece: SentencePieceTokenizer, converted: HuggingFaceTokenizer, ids: list[int]
) -> None:
    """Byte pieces that form no character too: the library's own ByteFallback decoder would
    turn a valid byte beside an invalid one into U+FFFD, which SentencePiece does not. (The
    unknown piece, 0, is a special token with no text here, `` ⁇ `` in SentencePiece.)"""
    assert converted.decode(ids) == sentencepiece.decode(ids)
    prompt = sentencepiece.encode("The")
    detok = IncrementalDetokenizer(converted, prompt)
    streamed = "".join(detok.add(token) for token in ids) + detok.flush()
    whole, head = converted.decode(prompt + ids), converted.decode(prompt)
    assert whole.startswith(head) and streamed == whole[len(head) :]
