"""The demo model's end of turn: an exact circuit that makes ``</s>`` likelier as text grows.

A bigram table has no notion of length, so its likeliest answer never ends (greedy decoding
loops on ". If the s.") and a sampled one rarely does; an agent SDK then refuses every
``incomplete`` turn. This module adds, to the otherwise inert decoder layer, the smallest exact
mechanism that ends an answer after a sentence or a few:

* **Position.** The attention has all-zero queries and keys, so each position attends uniformly
  to the ``n`` positions so far; only ``<s>`` has a nonzero value (1), so the attention output is
  ``z = 1/n`` (when the text starts with ``<s>``, as the worker's prompts do). It is written to
  one extra residual dimension (``position_dim``). No position table: no length limit.
* **Sentence end.** One ReLU unit of the feed-forward layer fires only on a sentence-end piece
  (``.``, ``).``, ``().`` in the demo vocabulary) and reads ``z``: its output is
  ``gain * (1/start - 1/n)``, clipped at 0, written to a second extra dimension (``end_dim``)
  that the projection adds to the ``</s>`` logit alone. Other pieces get exactly 0 (the ReLU
  is far below its threshold).

So ``logit(</s> | t, n) = table[t, </s>] + bias(n)`` after a sentence end and ``table[t]``
elsewhere. ``bias`` is 0 up to position ``start``, then rises to ``gain / start``. The layer
norms before both sublayers see a one-hot vector plus at most ``z``, so their mean and spread
have closed forms: :func:`end_bias` computes the same numbers in float64, and the builder's
self-check compares them with CTranslate2's output.
Positions count the prompt too: a long prompt gets a short answer, which a demo can afford.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from ctranslate2.specs import transformer_spec

# A piece that ends a sentence: a period or question mark, after closing brackets at most.
# ("!" is mostly "!=" in docstrings, "..." a doctest continuation, "0." a number.)
SENTENCE_END = re.compile(r"▁?[()]*[.?]")
# No end before this position; past it the bias grows towards GAIN / START. Greedy answers to a
# short prompt end at the first sentence end past ~START * 1.15 (the table's margin after "."
# is 1.5 nats), sampled ones within a few sentences.
START = 32
GAIN = 12.0 * START
# How far below its threshold the ReLU sits on other pieces (it must exceed GAIN / START).
GATE = 16.0
LAYER_NORM_EPSILON = 1e-6
# CTranslate2 needs a decoder layer (0 layers fails to load); these keep it tiny.
LAYER_HEAD_DIM = 2
LAYER_FFN_DIM = 2

FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True)
class EndCircuit:
    """Where the circuit lives in a model of ``vocab`` pieces, and its shape."""

    vocab: int
    bos_id: int
    eos_id: int
    end_ids: tuple[int, ...]
    start: float = START
    gain: float = GAIN

    @property
    def d_model(self) -> int:
        """The one-hot dimensions plus ``position_dim`` and ``end_dim``."""
        return self.vocab + 2

    @property
    def position_dim(self) -> int:
        return self.vocab

    @property
    def end_dim(self) -> int:
        return self.vocab + 1


def sentence_end_ids(pieces: Sequence[str]) -> tuple[int, ...]:
    """Ids of the pieces that end a sentence."""
    return tuple(i for i, piece in enumerate(pieces) if SENTENCE_END.fullmatch(piece))


def _norm_scale(d_model: int) -> float:
    """``sqrt(var + eps)`` of a one-hot vector: what a layer norm divides it by."""
    mean = 1.0 / d_model
    return math.sqrt(1.0 / d_model - mean * mean + LAYER_NORM_EPSILON)


def fill_layer(
    layer: transformer_spec.TransformerDecoderLayerSpec, d_model: int, circuit: EndCircuit | None
) -> None:
    """Set the decoder layer's weights: the circuit's, or all zero (it then adds nothing)."""
    d, head, ffn_dim = d_model, LAYER_HEAD_DIM, LAYER_FFN_DIM
    attention, ffn = layer.self_attention, layer.ffn
    for norm in (attention.layer_norm, ffn.layer_norm):
        norm.gamma, norm.beta = np.ones(d, dtype=np.float32), np.zeros(d, dtype=np.float32)
    for linear, shape in (
        (attention.linear[0], (3 * head, d)),  # rows: queries, keys, values
        (attention.linear[1], (d, head)),
        (ffn.linear_0, (ffn_dim, d)),
        (ffn.linear_1, (d, ffn_dim)),
    ):
        linear.weight = np.zeros(shape, dtype=np.float32)
        linear.bias = np.zeros(shape[0], dtype=np.float32)
    if circuit is None:
        return
    # Queries and keys stay zero. The normed one-hot of <s> reads (1 - 1/d) / s at <s> and
    # -1/d / s for every other piece: the first value is 1 for <s>, 0 for the rest.
    attention.linear[0].weight[2 * head, circuit.bos_id] = _norm_scale(d)
    attention.linear[0].bias[2 * head] = 1.0 / d
    attention.linear[1].weight[circuit.position_dim, 0] = 1.0
    ffn.linear_0.weight, ffn.linear_0.bias = _gate_weights(circuit)
    ffn.linear_1.weight[circuit.end_dim, 0] = 1.0


def _gate_weights(circuit: EndCircuit) -> tuple[FloatArray, FloatArray]:
    """The ReLU unit: ``GATE * ([t is an end] - 1) + gain * (1/start - z)``, nearly.

    The FFN's layer norm subtracts its input's mean, which the weights cancel (they sum to 0,
    through ``end_dim``, still 0 at that point), and divides by its spread, which barely moves
    with ``z``: the weights are scaled by its value at ``z`` = 0, and :func:`end_bias` keeps
    the remainder (under 0.1% for a prompt of 20 tokens or more) exact.
    """
    scale = _norm_scale(circuit.d_model)
    weight = np.zeros((LAYER_FFN_DIM, circuit.d_model), dtype=np.float32)
    weight[0, list(circuit.end_ids)] = GATE * scale
    weight[0, circuit.position_dim] = -circuit.gain * scale
    weight[0, circuit.end_dim] = -float(weight[0].sum(dtype=np.float64))
    bias = np.zeros(LAYER_FFN_DIM, dtype=np.float32)
    bias[0] = circuit.gain / circuit.start - GATE
    return weight, bias


def end_bias(circuit: EndCircuit, ids: Sequence[int]) -> npt.NDArray[np.float64]:
    """What the circuit adds to the ``</s>`` logit at each position of ``ids``, in float64."""
    d = circuit.d_model
    tokens = np.asarray(ids, dtype=np.int64)
    z = np.cumsum(tokens == circuit.bos_id) / np.arange(1, len(tokens) + 1)
    weight, bias = _gate_weights(circuit)
    row = weight[0].astype(np.float64)
    mean = (1.0 + z) / d
    scale = np.sqrt((1.0 + z * z) / d - mean * mean + LAYER_NORM_EPSILON)
    # W . (x - mean) with x = onehot(t) + z at position_dim.
    dot = row[tokens] + row[circuit.position_dim] * z - mean * row.sum()
    return np.asarray(np.maximum(dot / scale + float(bias[0]), 0.0), dtype=np.float64)


def expected_log_probs(
    table: FloatArray, circuit: EndCircuit, ids: Sequence[int]
) -> npt.NDArray[np.float64]:
    """``log P(. | ids[:i+1])`` at each position: the table row plus the end bias, renormalized."""
    logits = table[list(ids)].astype(np.float64)
    logits[:, circuit.eos_id] += end_bias(circuit, ids)
    shifted = logits - logits.max(axis=1, keepdims=True)
    return np.asarray(shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True)))
