"""The offline model builders, checked against real CTranslate2 (no mocks).

The demo model must compute exactly the bigram table it was compiled from, plus its end-of-turn
bias, and the random Llama must be a real Llama: its logits are compared with a small numpy
implementation.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import ctranslate2
import numpy as np
import pytest
import sentencepiece as spm
from ctranslate2.specs import attention_spec, common_spec, transformer_spec

from ops.model_builders import demo as demo_model
from ops.model_builders import demo_end
from ops.model_builders import random_llama as random_model
from ops.model_builders.demo_corpus import collect_corpus
from worker.engine.model_hints import resolve_compute_type

MAX_MODEL_BYTES = 50 * 1024 * 1024
PROMPTS = [
    "User: Hi\nAssistant:",
    "User: What is the weather in Paris?\nAssistant:",
    "The socket module",
    "Return the",
    "System: Be brief.\nUser: Explain the logging module in one sentence, please.\nAssistant:",
]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_model.build_demo_model(tmp_path_factory.mktemp("models") / "demo")


@pytest.fixture(scope="module")
def tokenizer(demo_dir: Path) -> spm.SentencePieceProcessor:
    return demo_model.load_tokenizer(demo_dir / demo_model.TOKENIZER_FILE)


@pytest.fixture(scope="module")
def generator(demo_dir: Path) -> Iterator[ctranslate2.Generator]:
    # Dropped explicitly: a Generator still alive at interpreter exit can abort the process.
    gen = ctranslate2.Generator(str(demo_dir), device="cpu")
    yield gen
    del gen


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- demo model -----------------------------------------------------------------------------


def test_demo_model_is_complete_and_small(demo_dir: Path) -> None:
    assert demo_model.demo_model_ready(demo_dir)
    assert (demo_dir / demo_model.MODEL_FILE).stat().st_size < MAX_MODEL_BYTES
    config = json.loads((demo_dir / "config.json").read_text())
    assert (config["bos_token"], config["eos_token"], config["unk_token"]) == (
        "<s>",
        "</s>",
        "<unk>",
    )
    assert not [p for p in demo_dir.parent.iterdir() if p.name.startswith(".")]


def test_vocabulary_is_the_tokenizer_pieces(
    demo_dir: Path, tokenizer: spm.SentencePieceProcessor
) -> None:
    sp = tokenizer
    vocabulary = json.loads((demo_dir / "vocabulary.json").read_text())
    assert len(vocabulary) == demo_model.VOCAB_SIZE
    assert vocabulary == [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    assert vocabulary[:3] == ["<unk>", "<s>", "</s>"]


@pytest.mark.parametrize("text", ["héllo ☃ 日本", "tabs\tand\nnewlines  twice", " lead"])
def test_tokenizer_round_trips_any_text(tokenizer: spm.SentencePieceProcessor, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_logits_equal_the_bigram_table(demo_dir: Path) -> None:
    every_token = range(demo_model.VOCAB_SIZE)
    assert demo_model.verify_demo_model(demo_dir, every_token) < demo_model.MAX_LOGPROB_ERROR


def test_verification_sees_a_model_without_its_end_bias(tmp_path: Path, demo_dir: Path) -> None:
    sp = demo_model.load_tokenizer(demo_dir / demo_model.TOKENIZER_FILE)
    table = demo_model.bigram_log_probs(demo_model.encode_corpus(sp, collect_corpus()))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    demo_model.save_bigram_model(table, pieces, tmp_path)
    (tmp_path / demo_model.TOKENIZER_FILE).write_bytes((demo_dir / "tokenizer.model").read_bytes())
    assert demo_model.verify_demo_model(tmp_path) > 1.0


def test_every_bigram_model_is_served_in_float32(tmp_path: Path) -> None:
    """A scripted model's greedy path holds only at float32; ``auto`` is int8 on most CPUs."""
    table = np.full((4, 4), -30.0, dtype=np.float32)
    demo_model.save_bigram_model(table, ["<unk>", "<s>", "</s>", "a"], tmp_path)
    assert resolve_compute_type(tmp_path, "auto") == "float32"
    assert resolve_compute_type(tmp_path, "int8") == "int8"  # explicit configuration wins


def test_end_bias_grows_after_sentence_ends_only(tokenizer: spm.SentencePieceProcessor) -> None:
    circuit = demo_model.demo_circuit(tokenizer)
    assert {tokenizer.id_to_piece(i) for i in circuit.end_ids} >= {".", ")."}
    period, word = tokenizer.piece_to_id("."), tokenizer.piece_to_id("▁the")
    bias = demo_end.end_bias(circuit, [demo_model.BOS_ID] + [period] * 400)
    assert not bias[: demo_end.START].any()
    assert np.all(np.diff(bias[demo_end.START - 1 :]) > 0)
    assert 1.5 < bias[40] < bias[100] < bias[-1] < demo_end.GAIN / demo_end.START
    assert not demo_end.end_bias(circuit, [demo_model.BOS_ID] + [word] * 400).any()


def test_end_of_text_is_rare(tokenizer: spm.SentencePieceProcessor) -> None:
    sequences = demo_model.encode_corpus(tokenizer, collect_corpus())
    table = demo_model.bigram_log_probs(sequences)
    assert demo_model.mean_eos_probability(table, sequences) < 0.005
    probs = np.exp(table.astype(np.float64))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-4)
    assert probs.min() > 0


def test_sampling_writes_docstring_like_text(
    generator: ctranslate2.Generator, tokenizer: spm.SentencePieceProcessor
) -> None:
    ctranslate2.set_random_seed(7)
    results = generator.generate_batch(
        [["<s>"]] * 4,
        max_length=60,
        sampling_topk=0,
        sampling_temperature=1.0,
        include_prompt_in_result=False,
        end_token=[],  # ignore_eos: 60 tokens each
    )
    texts = [tokenizer.decode(result.sequences_ids[0]) for result in results]
    words = " ".join(texts).split()
    assert len(words) > 4 * 20
    assert sum(word.strip(".,:;()'\"`").isalpha() for word in words) > len(words) / 2
    assert {"the", "a", "of", "to", "is"} & {word.lower() for word in words}


def test_greedy_answers_end_after_a_sentence(
    generator: ctranslate2.Generator, tokenizer: spm.SentencePieceProcessor
) -> None:
    prompts = [["<s>", *tokenizer.encode(text, out_type=str)] for text in PROMPTS]
    results = generator.generate_batch(prompts, max_length=600, include_prompt_in_result=False)
    for prompt, result in zip(prompts, results, strict=True):
        ids = result.sequences_ids[0]
        assert 0 < len(ids) < 100, prompt
        assert len(prompt) + len(ids) > demo_end.START
        assert ids[-1] in demo_model.demo_circuit(tokenizer).end_ids
    # Batched with prompts of other lengths (padding), each answer is the one it gets alone.
    for prompt, result in zip(prompts, results, strict=True):
        alone = generator.generate_batch([prompt], max_length=600, include_prompt_in_result=False)
        assert alone[0].sequences_ids == result.sequences_ids


def test_sampled_answers_mostly_end(
    generator: ctranslate2.Generator, tokenizer: spm.SentencePieceProcessor
) -> None:
    ctranslate2.set_random_seed(3)
    prompts = [["<s>", *tokenizer.encode(text, out_type=str)] for text in PROMPTS] * 4
    results = generator.generate_batch(
        prompts, max_length=600, sampling_topk=0, include_prompt_in_result=False
    )
    lengths = sorted(len(result.sequences_ids[0]) for result in results)
    assert lengths[-1] < 600  # every one ended
    assert lengths[len(lengths) * 9 // 10] < 100


def test_greedy_generation_without_end_runs_to_max_length(
    generator: ctranslate2.Generator, tokenizer: spm.SentencePieceProcessor
) -> None:
    result = generator.generate_batch(
        [["<s>"]], max_length=300, include_prompt_in_result=False, end_token=[]
    )
    ids = result[0].sequences_ids[0]
    assert len(ids) == 300
    assert tokenizer.decode(ids).strip()


def test_existing_model_is_reused(demo_dir: Path) -> None:
    before = (demo_dir / demo_model.MODEL_FILE).stat().st_mtime_ns
    assert demo_model.build_demo_model(demo_dir) == demo_dir
    assert (demo_dir / demo_model.MODEL_FILE).stat().st_mtime_ns == before


def test_build_is_deterministic(demo_dir: Path, tmp_path: Path) -> None:
    again = demo_model.build_demo_model(tmp_path / "demo", force=True)
    names = (demo_model.MODEL_FILE, demo_model.TOKENIZER_FILE, "vocabulary.json", "trickle.json")
    for name in (*names, demo_model.BUILD_FILE):
        assert sha256(again / name) == sha256(demo_dir / name)


def test_a_build_from_an_older_builder_is_replaced(demo_dir: Path, tmp_path: Path) -> None:
    old = tmp_path / "demo"
    shutil.copytree(demo_dir, old)
    (old / demo_model.BUILD_FILE).unlink()  # builds before the end-of-turn circuit had none
    (old / demo_model.MODEL_FILE).write_bytes(b"stale")
    assert demo_model.demo_model_ready(old) and not demo_model.demo_model_current(old)
    demo_model.build_demo_model(old)
    assert demo_model.demo_model_current(old)
    assert sha256(old / demo_model.MODEL_FILE) == sha256(demo_dir / demo_model.MODEL_FILE)


# --- random Llama ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Path:
    tokenizer_model = demo_dir / demo_model.TOKENIZER_FILE
    return random_model.build_random_llama(tmp_path_factory.mktemp("llama") / "m", tokenizer_model)


def test_random_llama_streams_tokens(
    llama_dir: Path, tokenizer: spm.SentencePieceProcessor
) -> None:
    generator = ctranslate2.Generator(str(llama_dir), device="cpu")
    steps = list(
        generator.generate_tokens(["<s>"], max_length=20, sampling_topk=0, return_log_prob=True)
    )
    del generator
    assert 1 <= len(steps) <= 20
    assert [step.step for step in steps] == list(range(len(steps)))
    assert all(np.isfinite(step.log_prob) for step in steps)
    assert isinstance(tokenizer.decode([step.token_id for step in steps]), str)


def test_random_llama_matches_a_numpy_llama(llama_dir: Path) -> None:
    sp = demo_model.load_tokenizer(llama_dir / demo_model.TOKENIZER_FILE)
    vocabulary = random_model.read_vocabulary(llama_dir / demo_model.TOKENIZER_FILE)
    spec = random_model.llama_spec(
        np.random.default_rng(0), vocabulary.pieces, 64, 2, 4, 128, vocabulary
    )
    ids = [1, *sp.encode("Return the value of the attribute.")]
    generator = ctranslate2.Generator(str(llama_dir), device="cpu")
    logits = np.asarray(generator.forward_batch([ids]))[0]
    del generator
    np.testing.assert_allclose(logits, numpy_llama_logits(spec.decoder, ids), atol=1e-4)


def test_random_llama_pads_vocabulary_and_quantizes(tmp_path: Path, demo_dir: Path) -> None:
    out = random_model.build_random_llama(
        tmp_path / "m", demo_dir / demo_model.TOKENIZER_FILE, vocab_size=2048, quantization="int8"
    )
    vocabulary = json.loads((out / "vocabulary.json").read_text())
    assert len(vocabulary) == 2048
    assert vocabulary[-1] == "<extra_47>"
    generator = ctranslate2.Generator(str(out), device="cpu")
    result = generator.generate_batch([["<s>"]], max_length=5, include_prompt_in_result=False)
    del generator
    assert 1 <= len(result[0].sequences_ids[0]) <= 5


def test_random_llama_rebuilds_only_when_parameters_change(tmp_path: Path, demo_dir: Path) -> None:
    tokenizer_model = demo_dir / demo_model.TOKENIZER_FILE
    out = random_model.build_random_llama(tmp_path / "m", tokenizer_model, seed=1)
    first = sha256(out / demo_model.MODEL_FILE)
    random_model.build_random_llama(out, tokenizer_model, seed=1)
    assert sha256(out / demo_model.MODEL_FILE) == first
    random_model.build_random_llama(out, tokenizer_model, seed=2)
    assert sha256(out / demo_model.MODEL_FILE) != first


def test_random_llama_rejects_bad_shapes(tmp_path: Path, demo_dir: Path) -> None:
    tokenizer_model = demo_dir / demo_model.TOKENIZER_FILE
    with pytest.raises(ValueError, match="divisible"):
        random_model.build_random_llama(tmp_path / "a", tokenizer_model, d_model=30)
    with pytest.raises(ValueError, match="smaller"):
        random_model.build_random_llama(tmp_path / "b", tokenizer_model, vocab_size=10)


# --- numpy reference Llama ------------------------------------------------------------------


def numpy_llama_logits(d: transformer_spec.TransformerDecoderSpec, ids: list[int]) -> np.ndarray:
    """Llama forward pass in float64: pre-RMSNorm, rotary (halves), SwiGLU, no biases."""
    hidden = weight(d.embeddings.weight)[ids].astype(np.float64)
    for layer in d.layer:
        hidden = hidden + attention(layer.self_attention, hidden)
        hidden = hidden + swiglu(layer.ffn, hidden)
    normed = rms_norm(hidden, d.layer_norm)
    return np.asarray(normed @ weight(d.projection.weight).T)


def weight(variable: object) -> np.ndarray:
    return np.asarray(variable.numpy() if hasattr(variable, "numpy") else variable)


def rms_norm(x: np.ndarray, norm: common_spec.LayerNormSpec) -> np.ndarray:
    gamma = weight(norm.gamma)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + random_model.LAYER_NORM_EPSILON) * gamma


def attention(
    spec: attention_spec.MultiHeadAttentionSpec, hidden: np.ndarray, num_heads: int = 4
) -> np.ndarray:
    n, dim = hidden.shape
    head_dim = dim // num_heads
    x = rms_norm(hidden, spec.layer_norm)
    qkv = x @ weight(spec.linear[0].weight).T
    q, k, v = (part.reshape(n, num_heads, head_dim) for part in np.split(qkv, 3, axis=-1))
    q, k = rotary(q), rotary(k)
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(head_dim)
    scores += np.triu(np.full((n, n), -np.inf), 1)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("hqk,khd->qhd", probs, v).reshape(n, dim)
    return np.asarray(out @ weight(spec.linear[1].weight).T)


def rotary(x: np.ndarray, base: float = 10000.0) -> np.ndarray:
    n, _, head_dim = x.shape
    inv_freq = 1.0 / base ** (np.arange(0, head_dim, 2) / head_dim)
    angles = np.arange(n)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)[:, None, :]
    half = head_dim // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return np.asarray(x * np.cos(angles) + rotated * np.sin(angles))


def swiglu(spec: transformer_spec.FeedForwardSpec, hidden: np.ndarray) -> np.ndarray:
    x = rms_norm(hidden, spec.layer_norm)
    gate = x @ weight(spec.linear_0.weight).T
    up = x @ weight(spec.linear_0_noact.weight).T
    return np.asarray((gate / (1 + np.exp(-gate)) * up) @ weight(spec.linear_1.weight).T)
