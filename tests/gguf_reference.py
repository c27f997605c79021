"""An independent reference for GGUF Llama models: the forward pass written out in NumPy.

The converter (``ops.model_builders.gguf_llama``) turns a GGUF file into a CTranslate2 model; this
module computes what that model must compute, straight from the same file and without sharing
any of the converter's code. It reads the tensors in llama.cpp's own layout (each head's rotary
pairs adjacent, GGML's rotary convention), so a mistake in the converter's un-permuting shows up
as different logits rather than being repeated here.

The block, as in Llama: ``h = x + Wo attention(RoPE(Wq rms(x)), RoPE(Wk rms(x)), Wv rms(x))``,
``out = h + Wdown (silu(Wgate rms(h)) * Wup rms(h))``, grouped-query attention (query head ``i``
reads key/value head ``i // (heads / kv_heads)``), a final RMSNorm and the output matrix (the
embedding matrix when the file ties them).
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
from gguf import GGUFReader
from gguf.quants import dequantize

Array = npt.NDArray[np.float32]


@dataclass
class KVCache:
    """Keys and values of every position seen so far, per layer (kv_heads, positions, dim)."""

    keys: list[Array] = field(default_factory=list)
    values: list[Array] = field(default_factory=list)

    @property
    def length(self) -> int:
        return 0 if not self.keys else int(self.keys[0].shape[1])


class ReferenceLlama:
    """The model of a Llama GGUF file, in float32 NumPy."""

    def __init__(self, path: Path) -> None:
        reader = GGUFReader(path)

        def meta(key: str) -> float:
            return float(reader.fields[f"llama.{key}"].contents())

        self.layers = int(meta("block_count"))
        self.heads = int(meta("attention.head_count"))
        self.kv_heads = int(meta("attention.head_count_kv"))
        self.eps = meta("attention.layer_norm_rms_epsilon")
        self.rope_base = meta("rope.freq_base")
        self.tensors: dict[str, Array] = {}
        for tensor in reader.tensors:
            rows_first = tuple(int(n) for n in reversed(tensor.shape))
            values = dequantize(tensor.data, tensor.tensor_type).reshape(rows_first)
            self.tensors[tensor.name] = np.ascontiguousarray(values, dtype=np.float32)
        self.head_dim = self.tensors["token_embd.weight"].shape[1] // self.heads
        self.output = self.tensors.get("output.weight", self.tensors["token_embd.weight"])

    def logits(self, ids: list[int], cache: KVCache | None = None) -> Array:
        """Next-token logits after each of ``ids`` (rows), continuing ``cache`` if given."""
        cache = cache if cache is not None else KVCache()
        start = cache.length
        x = self.tensors["token_embd.weight"][ids]
        for layer in range(self.layers):
            x = x + self._attention(layer, x, start, cache)
            x = x + self._ffn(layer, x)
        return self._rms(x, self.tensors["output_norm.weight"]) @ self.output.T

    def greedy(self, prompt: list[int], steps: int) -> list[int]:
        """``steps`` greedy tokens after ``prompt`` (no end token: always ``steps`` of them)."""
        cache = KVCache()
        logits = self.logits(prompt, cache)[-1]
        out: list[int] = []
        for _ in range(steps):
            out.append(int(np.argmax(logits)))
            logits = self.logits(out[-1:], cache)[-1]
        return out

    def _rms(self, x: Array, gain: Array) -> Array:
        scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return (x * scale * gain).astype(np.float32)

    def _attention(self, layer: int, x: Array, start: int, cache: KVCache) -> Array:
        w = self._layer_weights(layer)
        h = self._rms(x, w["attn_norm.weight"])
        n = x.shape[0]
        q = (h @ w["attn_q.weight"].T).reshape(n, self.heads, self.head_dim).transpose(1, 0, 2)
        k = (h @ w["attn_k.weight"].T).reshape(n, self.kv_heads, self.head_dim).transpose(1, 0, 2)
        v = (h @ w["attn_v.weight"].T).reshape(n, self.kv_heads, self.head_dim).transpose(1, 0, 2)
        positions = np.arange(start, start + n)
        q, k = self._rope(q, positions), self._rope(k, positions)
        if layer == len(cache.keys):
            cache.keys.append(k)
            cache.values.append(v)
        else:
            cache.keys[layer] = np.concatenate([cache.keys[layer], k], axis=1)
            cache.values[layer] = np.concatenate([cache.values[layer], v], axis=1)
        keys, values = cache.keys[layer], cache.values[layer]
        group = self.heads // self.kv_heads
        keys, values = np.repeat(keys, group, axis=0), np.repeat(values, group, axis=0)
        scores = q @ keys.transpose(0, 2, 1) / np.sqrt(self.head_dim)
        seen = np.arange(keys.shape[1])
        scores = np.where(seen[None, None, :] <= positions[None, :, None], scores, -np.inf)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights = scores / scores.sum(axis=-1, keepdims=True)
        context = (weights @ values).transpose(1, 0, 2).reshape(n, self.heads * self.head_dim)
        return (context @ w["attn_output.weight"].T).astype(np.float32)

    def _rope(self, x: Array, positions: npt.NDArray[np.int64]) -> Array:
        """GGML's rotary: element pairs (2i, 2i+1) of each head turn by position x base^(-2i/d)."""
        pairs = np.arange(self.head_dim // 2)
        inv_freq = self.rope_base ** (-2.0 * pairs / self.head_dim)
        angle = positions[:, None] * inv_freq[None, :]  # (positions, pairs)
        cos, sin = np.cos(angle), np.sin(angle)
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def _ffn(self, layer: int, x: Array) -> Array:
        w = self._layer_weights(layer)
        h = self._rms(x, w["ffn_norm.weight"])
        gate = h @ w["ffn_gate.weight"].T
        silu = gate / (1.0 + np.exp(-gate))
        return ((silu * (h @ w["ffn_up.weight"].T)) @ w["ffn_down.weight"].T).astype(np.float32)

    def _layer_weights(self, layer: int) -> dict[str, Array]:
        prefix = f"blk.{layer}."
        return {
            name[len(prefix) :]: value
            for name, value in self.tensors.items()
            if name.startswith(prefix)
        }


@dataclass(frozen=True)
class ReferenceOutputs:
    """What the reference says for each prompt: logits at every position, greedy tokens."""

    logits: list[Array]
    greedy: list[list[int]]


def reference_outputs(path: Path, prompts: list[list[int]], steps: int) -> ReferenceOutputs:
    """The reference's logits and ``steps`` greedy tokens for each prompt."""
    model = ReferenceLlama(path)
    return ReferenceOutputs(
        logits=[model.logits(ids) for ids in prompts],
        greedy=[model.greedy(ids, steps) for ids in prompts],
    )


def reference_outputs_apart(path: Path, prompts: list[list[int]], steps: int) -> ReferenceOutputs:
    """``reference_outputs`` in a fresh process with single-threaded BLAS: on a busy machine
    OpenBLAS's threads wait on each other (ten times slower on two shared cores), and the
    reference's half a gigabyte of float32 weights goes when the process does."""
    saved = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # read by the child's NumPy at import
    try:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
            return pool.submit(reference_outputs, path, prompts, steps).result()
    finally:
        if saved is None:
            del os.environ["OPENBLAS_NUM_THREADS"]
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = saved
