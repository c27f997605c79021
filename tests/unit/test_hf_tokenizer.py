"""The Hugging Face tokenizer (byte-level BPE) behind Trickle's one interface, on a tokenizer.json
trained here (tests/bpe_tokenizer.py): round trips, special tokens as single ids, each id's
exact bytes, incremental detokenization that never sends half a character, and a second
encoder (tests/reference_bpe.py) and llguidance's own reading of the file as oracles."""

from __future__ import annotations

import json
import re
from pathlib import Path

import llguidance
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.bpe_tokenizer import IM_END, IM_START, MULTILINGUAL, train_bpe, training_text
from tests.reference_bpe import ReferenceBPE
from trickle.config.sections import ModelSettings
from trickle.events import alternative_bytes, alternative_text
from trickle.grammar_matcher import MatcherCache
from trickle.tokenization import load_tokenizer
from trickle.tokenization.huggingface_tokenizer import HuggingFaceTokenizer
from trickle.tokenization.interface import SPECIAL_MARK
from worker.engine.detok import IncrementalDetokenizer

# Text the tokenizer never saw: rare scripts, astral characters, combining marks, controls.
UNSEEN = [
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🦀 漢字かな交じり文 ﷺ e\u0301 \u200d\u2028 tab\tnull\x00 end",  # noqa: RUF001
    "Ünïcödé ☃ 日本語 🎉 emoji, naïve café",
    "    indented\n\n\n  code() { return [1, 2]; }  ",
    "",
]
CHAT = f"{IM_START}user\nCafé? 中文 😀{IM_END}\n{IM_START}assistant\n"


@pytest.fixture(scope="module")
def tokenizer(bpe_tokenizer_dir: Path) -> HuggingFaceTokenizer:
    return load_tokenizer(ModelSettings("bpe", str(bpe_tokenizer_dir)))  # type: ignore[return-value]


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return [*training_text()[:400], *MULTILINGUAL, *UNSEEN]


def test_the_directory_picks_the_hugging_face_tokenizer(tokenizer: HuggingFaceTokenizer) -> None:
    assert isinstance(tokenizer, HuggingFaceTokenizer)
    # tokenizer_config.json names the start and end tokens; generation_config.json adds
    # <|endoftext|>; the post-processor adds no start token, and no file asks for one.
    assert tokenizer.bos_id == tokenizer.piece_id(IM_START)
    assert tokenizer.eos_id == tokenizer.piece_id(IM_END)
    assert tokenizer.end_ids == {tokenizer.piece_id(IM_END), tokenizer.piece_id("<|endoftext|>")}
    assert not tokenizer.add_bos and not tokenizer.drops_template_bos
    assert tokenizer.vocab_size == 1024


def test_training_is_deterministic() -> None:
    assert train_bpe().to_str() == train_bpe().to_str()


def test_text_round_trips(tokenizer: HuggingFaceTokenizer, corpus: list[str]) -> None:
    for text in corpus:
        assert tokenizer.decode(tokenizer.encode(text)) == text
        assert tokenizer.count(text) == len(tokenizer.encode(text))


def test_special_tokens_are_single_ids_and_decode_to_nothing(
    tokenizer: HuggingFaceTokenizer,
) -> None:
    ids = tokenizer.encode(CHAT)
    start, end = tokenizer.piece_id(IM_START), tokenizer.piece_id(IM_END)
    assert ids[0] == start and ids.count(start) == 2 and ids.count(end) == 1
    assert tokenizer.to_pieces([start, end]) == [IM_START, IM_END]
    assert tokenizer.decode(ids) == "user\nCafé? 中文 😀\nassistant\n"
    token_bytes = tokenizer.token_bytes()
    assert token_bytes[start] == SPECIAL_MARK + IM_START.encode()


def test_token_bytes_spell_the_text(tokenizer: HuggingFaceTokenizer, corpus: list[str]) -> None:
    token_bytes = tokenizer.token_bytes()
    for text in corpus:
        assert b"".join(token_bytes[i] for i in tokenizer.encode(text)) == text.encode()
        exact = tokenizer.encode_text(text)
        assert b"".join(token_bytes[i] for i in exact) == text.encode()


@settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=200, deadline=None
)
@given(st.lists(st.integers(3, 1023), max_size=16))
def test_token_bytes_are_what_decode_joins(tokenizer: HuggingFaceTokenizer, ids: list[int]) -> None:
    """Any ids, split characters and invalid UTF-8 included: the decoder's text is the
    concatenated bytes, decoded with replacement (the three ids below 3 are special)."""
    token_bytes = tokenizer.token_bytes()
    joined = b"".join(token_bytes[i] for i in ids)
    assert tokenizer.decode(ids) == joined.decode("utf-8", "replace")


def test_a_second_encoder_agrees(
    tokenizer: HuggingFaceTokenizer, bpe_tokenizer_dir: Path, corpus: list[str]
) -> None:
    reference = ReferenceBPE(bpe_tokenizer_dir / "tokenizer.json")
    for text in [*corpus, CHAT]:
        assert tokenizer.encode(text) == reference.encode(text), text


def test_llguidance_reads_the_same_bytes(tokenizer: HuggingFaceTokenizer) -> None:
    assert tokenizer.huggingface_json is not None
    theirs = llguidance.LLTokenizer(tokenizer.huggingface_json)
    ours = tokenizer.token_bytes()
    for index, spelled in enumerate(ours):
        if not spelled.startswith(SPECIAL_MARK):
            assert theirs.decode_bytes([index]) == spelled, index
        else:
            assert theirs.is_special_token(index)


def _streamed(tokenizer: HuggingFaceTokenizer, ids: list[int], prompt: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt)
    return [detok.add(token) for token in ids] + [detok.flush()]


def _whole(spelled: bytes) -> bool:
    try:
        spelled.decode()
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("text", [*MULTILINGUAL[:5], *UNSEEN[:2]])
def test_streaming_never_sends_half_a_character(tokenizer: HuggingFaceTokenizer, text: str) -> None:
    prompt = tokenizer.encode(CHAT)
    ids = tokenizer.encode(text)
    token_bytes = tokenizer.token_bytes()
    assert not all(_whole(token_bytes[i]) for i in ids)  # some character is split across ids
    chunks = _streamed(tokenizer, ids, prompt)
    assert "".join(chunks) == text == tokenizer.decode(ids)
    assert all("\ufffd" not in chunk for chunk in chunks), chunks


@settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=300, deadline=None
)
@given(st.lists(st.integers(0, 1023), max_size=24), st.text(max_size=6))
def test_streamed_text_is_the_decode_of_all_ids(
    tokenizer: HuggingFaceTokenizer, ids: list[int], prompt: str
) -> None:
    """Whatever the model emits (bytes that never form a character too), the stream adds up to
    the decode of every id at once, after any prompt (whose text ends on a whole character)."""
    assert "".join(_streamed(tokenizer, ids, tokenizer.encode(prompt))) == tokenizer.decode(ids)


def test_grammars_run_on_the_vocabulary(tokenizer: HuggingFaceTokenizer) -> None:
    cache = MatcherCache(tokenizer)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    matcher = cache.matcher(json.dumps({"grammars": [{"json_schema": schema}]}))
    answer = '{"city": "Zürich 中"}'
    assert matcher.consume_tokens(tokenizer.encode_text(answer))
    assert matcher.is_accepting()
    assert sorted(cache.vocabulary.eos_tokens) == sorted(tokenizer.end_ids)


def test_alternatives_carry_each_ids_bytes(tokenizer: HuggingFaceTokenizer) -> None:
    """A logprobs alternative's text and bytes: a lone byte of a character as OpenAI writes it
    ("bytes:\\xe4"), its bytes exact."""
    for spelled in tokenizer.token_bytes():
        text = alternative_text(spelled)
        assert alternative_bytes(text) == list(spelled)
        assert text.startswith("bytes:") or text == spelled.decode()


def test_ids_past_the_vocabulary_decode_to_nothing(tokenizer: HuggingFaceTokenizer) -> None:
    hello = tokenizer.encode("hello")
    assert tokenizer.decode([*hello, 5000]) == "hello"


def test_a_directory_without_a_tokenizer_names_itself(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"{tmp_path} has no tokenizer"):
        load_tokenizer(ModelSettings("none", str(tmp_path)))


def test_a_vocabulary_that_does_not_match_the_model_fails(
    bpe_tokenizer_dir: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_bytes((bpe_tokenizer_dir / "tokenizer.json").read_bytes())
    pieces = HuggingFaceTokenizer(model / "tokenizer.json").to_pieces(list(range(1024)))
    (model / "vocabulary.json").write_text(json.dumps(pieces[:1000]))
    with pytest.raises(ValueError, match="1024 ids but the model's vocabulary only 1000"):
        load_tokenizer(ModelSettings("short", str(model)))
    swapped = [pieces[1], pieces[0], *pieces[2:], "<extra_0>"]
    (model / "vocabulary.json").write_text(json.dumps(swapped))
    with pytest.raises(ValueError, match=re.escape("id 0 is '<|endoftext|>' in the tokenizer")):
        load_tokenizer(ModelSettings("swapped", str(model)))
    (model / "vocabulary.json").write_text(json.dumps([*pieces, "<extra_0>"]))  # padded: fine
    assert load_tokenizer(ModelSettings("padded", str(model))).vocab_size == 1024
