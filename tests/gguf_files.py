"""Small Llama GGUF files written with llama.cpp's own writer, for the converter's tests.

They are laid out as llama.cpp's converter lays out a real checkpoint: query and key rows
permuted for GGML's rotary (``llama_cpp_permute``), some tensors Q8_0-quantized, the embeddings
tied, and a byte-level BPE vocabulary with control tokens. ``overrides`` breaks one thing at a
time for the error tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import quantize
from tokenizers import pre_tokenizers

Q8_0 = GGMLQuantizationType.Q8_0
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a")]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SHAPE = {"layers": 2, "d_model": 64, "heads": 4, "kv_heads": 2, "ffn": 96, "rope_base": 1e5}


def vocabulary() -> tuple[list[str], list[int]]:
    """Control tokens, the 256 byte-level symbols, then the merged tokens."""
    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = SPECIALS + symbols + [left + right for left, right in MERGES]
    types = [TokenType.CONTROL] * len(SPECIALS) + [TokenType.NORMAL] * (len(tokens) - len(SPECIALS))
    return tokens, [int(t) for t in types]


def llama_cpp_permute(weight: npt.NDArray[np.float32], heads: int) -> npt.NDArray[np.float32]:
    """What llama.cpp's convert_hf_to_gguf.py does to q_proj and k_proj rows."""
    rows, cols = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def write_llama_gguf(path: Path, seed: int = 0, **overrides: Any) -> Path:
    """A random two-layer Llama GGUF at ``path``. ``overrides``: ``architecture``,
    ``extra_tokens`` (appended to the vocabulary only), ``tokenizer_model``."""
    rng = np.random.default_rng(seed)
    s = SHAPE
    tokens, types = vocabulary()
    vocab = len(tokens)
    tokens = tokens + list(overrides.get("extra_tokens", []))
    types = types + [int(TokenType.NORMAL)] * (len(tokens) - vocab)
    arch = overrides.get("architecture", "llama")
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(s["layers"])
    writer.add_context_length(512)
    writer.add_embedding_length(s["d_model"])
    writer.add_feed_forward_length(s["ffn"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_rope_freq_base(s["rope_base"])
    writer.add_rope_dimension_count(s["d_model"] // s["heads"])
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model(overrides.get("tokenizer_model", "gpt2"))
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([f"{left} {right}" for left, right in MERGES])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    def matrix(rows: int, cols: int) -> npt.NDArray[np.float32]:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def gain(size: int) -> npt.NDArray[np.float32]:
        return (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32)

    def q8(name: str, value: npt.NDArray[np.float32]) -> None:
        writer.add_tensor(name, quantize(value, GGMLQuantizationType.Q8_0), raw_dtype=Q8_0)

    d, kv_dim = s["d_model"], s["d_model"] // s["heads"] * s["kv_heads"]
    q8("token_embd.weight", (rng.standard_normal((vocab, d)) * 0.5).astype(np.float32))
    writer.add_tensor("output_norm.weight", gain(d))
    for layer in range(s["layers"]):
        prefix = f"blk.{layer}."
        writer.add_tensor(prefix + "attn_norm.weight", gain(d))
        q8(prefix + "attn_q.weight", llama_cpp_permute(matrix(d, d), s["heads"]))
        writer.add_tensor(
            prefix + "attn_k.weight", llama_cpp_permute(matrix(kv_dim, d), s["kv_heads"])
        )
        writer.add_tensor(prefix + "attn_v.weight", matrix(kv_dim, d))
        q8(prefix + "attn_output.weight", matrix(d, d))
        writer.add_tensor(prefix + "ffn_norm.weight", gain(d))
        q8(prefix + "ffn_gate.weight", matrix(s["ffn"], d))
        writer.add_tensor(prefix + "ffn_up.weight", matrix(s["ffn"], d))
        writer.add_tensor(prefix + "ffn_down.weight", matrix(d, s["ffn"]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
