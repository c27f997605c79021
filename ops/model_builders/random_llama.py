"""Random-weight Llama-style models, for tests and benchmarks that need a real architecture.

The demo bigram model exercises almost nothing of a transformer; these models run the same code
paths as a converted Llama checkpoint (RMSNorm, rotary attention, gated SiLU FFN, pre-norm, no
biases) at any size, from a fixed seed, with no download. Their output is random tokens. The
vocabulary is a SentencePiece model's, or a Hugging Face tokenizer.json's laid out as
``ct2-transformers-converter --copy_files tokenizer.json tokenizer_config.json
generation_config.json`` leaves it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sentencepiece as spm
from ctranslate2.specs import common_spec, model_spec, transformer_spec

from ops.model_builders.demo import MODEL_FILE, TOKENIZER_FILE, publish_model_dir
from trickle.tokenization.huggingface_tokenizer import HuggingFaceTokenizer

PARAMS_FILE = "random_model.json"
LAYER_NORM_EPSILON = 1e-5
EMBEDDING_STD = 0.02
HUGGINGFACE_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


@dataclass(frozen=True)
class Vocabulary:
    """A tokenizer's strings in id order, its special tokens' strings, and the files that go
    beside the model."""

    pieces: list[str]
    bos: str
    eos: str
    unk: str
    files: dict[str, bytes]


def build_random_llama(
    output_dir: Path,
    tokenizer_model: Path,
    *,
    d_model: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    ffn_dim: int = 128,
    vocab_size: int | None = None,
    seed: int = 0,
    quantization: str | None = None,
    force: bool = False,
) -> Path:
    """Build a random Llama-style CTranslate2 model into ``output_dir``; return the path.

    ``tokenizer_model``: a SentencePiece model file, or a directory with a Hugging Face
    ``tokenizer.json`` (its tokenizer_config.json and generation_config.json are copied too).
    An existing model is reused only if it was built with the same parameters and tokenizer.
    The vocabulary is the tokenizer's pieces, padded with ``<extra_N>`` up to ``vocab_size``.
    """
    output_dir = Path(output_dir)
    tokenizer = read_vocabulary(Path(tokenizer_model))
    pieces = padded(tokenizer.pieces, vocab_size)
    _check_shape(d_model, num_heads, quantization)
    params = {
        "d_model": d_model,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "ffn_dim": ffn_dim,
        "vocab_size": len(pieces),
        "seed": seed,
        "quantization": quantization,
        "tokenizer_sha256": _digest(tokenizer.files),
    }
    if not force and _built_with(output_dir, params):
        return output_dir
    rng = np.random.default_rng(seed)
    spec = llama_spec(rng, pieces, d_model, num_layers, num_heads, ffn_dim, tokenizer)
    spec.optimize(quantization=quantization)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.build-", dir=output_dir.parent))
    try:
        spec.save(str(staging))
        for name, content in tokenizer.files.items():
            (staging / name).write_bytes(content)
        (staging / PARAMS_FILE).write_text(json.dumps(params, sort_keys=True) + "\n")
        publish_model_dir(staging, output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output_dir


def read_vocabulary(tokenizer_model: Path) -> Vocabulary:
    """The vocabulary of a SentencePiece file, or of a directory's Hugging Face tokenizer."""
    if tokenizer_model.is_dir():
        files = {
            name: (tokenizer_model / name).read_bytes()
            for name in HUGGINGFACE_FILES
            if (tokenizer_model / name).is_file()
        }
        config = json.loads(files.get("tokenizer_config.json", b"{}"))
        names = [str(config.get(key) or "") for key in ("bos_token", "eos_token", "unk_token")]
        hf = HuggingFaceTokenizer(tokenizer_model / HUGGINGFACE_FILES[0], None, *names[:2])
        pieces = hf.to_pieces(list(range(hf.vocab_size)))
        bos, eos, unk = (name or pieces[0] for name in names)  # none: any string it has
        return Vocabulary(pieces, bos, eos, unk, files)
    sp_bytes = tokenizer_model.read_bytes()
    sp = spm.SentencePieceProcessor(model_proto=sp_bytes)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    return Vocabulary(
        pieces,
        _piece_or(sp, sp.bos_id(), "<s>"),
        _piece_or(sp, sp.eos_id(), "</s>"),
        _piece_or(sp, sp.unk_id(), "<unk>"),
        {TOKENIZER_FILE: sp_bytes},
    )


def padded(pieces: list[str], vocab_size: int | None = None) -> list[str]:
    """The tokenizer's pieces in id order, padded with ``<extra_N>`` to ``vocab_size``."""
    if vocab_size is None:
        return pieces
    if vocab_size < len(pieces):
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {len(pieces)}")
    return pieces + [f"<extra_{i}>" for i in range(vocab_size - len(pieces))]


def llama_spec(
    rng: np.random.Generator,
    pieces: list[str],
    d_model: int,
    num_layers: int,
    num_heads: int,
    ffn_dim: int,
    tokenizer: Vocabulary,
) -> transformer_spec.TransformerDecoderModelSpec:
    """The spec the Llama converter would produce, filled with small random weights."""
    spec = transformer_spec.TransformerDecoderModelSpec.from_config(
        num_layers,
        num_heads,
        activation=common_spec.Activation.SWISH,
        pre_norm=True,
        ffn_glu=True,
        rms_norm=True,
        rotary_dim=0,
        rotary_interleave=False,
    )
    decoder = spec.decoder
    vocab = len(pieces)
    decoder.scale_embeddings = False
    decoder.embeddings.weight = _normal(rng, (vocab, d_model), EMBEDDING_STD)
    decoder.layer_norm.gamma = np.ones(d_model, dtype=np.float32)
    decoder.projection.weight = _linear_weight(rng, vocab, d_model)
    for layer in decoder.layer:
        _fill_layer(layer, rng, d_model, ffn_dim)
    _set_config(spec.config, tokenizer)
    spec.register_vocabulary(pieces)
    spec.validate()
    return spec


def _fill_layer(
    layer: transformer_spec.TransformerDecoderLayerSpec,
    rng: np.random.Generator,
    d_model: int,
    ffn_dim: int,
) -> None:
    """Random attention and gated-FFN weights, unit RMSNorm gains, no biases (as in Llama)."""
    attention = layer.self_attention
    attention.layer_norm.gamma = np.ones(d_model, dtype=np.float32)
    attention.linear[0].weight = _linear_weight(rng, 3 * d_model, d_model)  # Fused q, k, v.
    attention.linear[1].weight = _linear_weight(rng, d_model, d_model)
    ffn = layer.ffn
    ffn.layer_norm.gamma = np.ones(d_model, dtype=np.float32)
    ffn.linear_0.weight = _linear_weight(rng, ffn_dim, d_model)  # Gate (SiLU).
    ffn.linear_0_noact.weight = _linear_weight(rng, ffn_dim, d_model)  # Up.
    ffn.linear_1.weight = _linear_weight(rng, d_model, ffn_dim)  # Down.


def _set_config(config: model_spec.ModelConfig, tokenizer: Vocabulary) -> None:
    """Special tokens from the tokenizer, so generation stops on its EOS."""
    config.bos_token = tokenizer.bos
    config.eos_token = tokenizer.eos
    config.unk_token = tokenizer.unk
    config.layer_norm_epsilon = LAYER_NORM_EPSILON


def _piece_or(sp: spm.SentencePieceProcessor, piece_id: int, default: str) -> str:
    """The piece for a special id, or ``default`` when the tokenizer has none (id -1)."""
    return str(sp.id_to_piece(piece_id)) if piece_id >= 0 else default


def _linear_weight(rng: np.random.Generator, out_dim: int, in_dim: int) -> np.ndarray:
    """Fan-in scaled weights: activations stay O(1) through any depth, so never NaN."""
    return _normal(rng, (out_dim, in_dim), 1.0 / np.sqrt(in_dim))


def _normal(rng: np.random.Generator, shape: tuple[int, int], std: float) -> np.ndarray:
    """Float32 normal samples (CTranslate2 rejects float64)."""
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _check_shape(d_model: int, num_heads: int, quantization: str | None) -> None:
    """Reject shapes CTranslate2 would fail on later with a less helpful message."""
    if d_model % num_heads:
        raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
    if (d_model // num_heads) % 2:
        raise ValueError("rotary embeddings need an even head dimension")
    if quantization is not None and quantization not in model_spec.ACCEPTED_MODEL_TYPES:
        raise ValueError(f"unknown quantization {quantization!r}")


def _digest(files: Mapping[str, bytes]) -> str:
    """The tokenizer's files' hash (a SentencePiece model's: its bytes alone, as before)."""
    if list(files) == [TOKENIZER_FILE]:
        return hashlib.sha256(files[TOKENIZER_FILE]).hexdigest()
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return digest.hexdigest()


def _built_with(output_dir: Path, params: Mapping[str, object]) -> bool:
    """Whether ``output_dir`` holds a finished model built from exactly ``params``."""
    if not (output_dir / MODEL_FILE).is_file():
        return False
    try:
        stored = json.loads((output_dir / PARAMS_FILE).read_text())
    except (OSError, ValueError):
        return False
    return bool(stored == dict(params))
