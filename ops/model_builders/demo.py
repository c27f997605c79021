"""The demo model: a bigram language model over standard-library docstrings, built offline.

Trickle needs a model that works with no network and no downloaded weights, so this module makes
one from what every Python install already has. It trains a small SentencePiece tokenizer on the
stdlib's docstrings, counts token bigrams, and compiles the bigram table *exactly* into a
CTranslate2 decoder-only model:

* the embeddings are one-hot rows (no embedding scaling, no position encodings), plus two
  dimensions the vocabulary never writes,
* the single decoder layer writes only to those two: the end-of-turn circuit of
  ``ops.model_builders.demo_end``, which makes ``</s>`` likelier after a sentence end as the
  text grows, so answers end after a sentence or a few,
* there is no final norm, so the logits are ``W @ onehot(t) = W[:, t] = log P(. | t)``, plus
  that bias on the ``</s>`` logit.

The output is word salad that reads like docstrings, which is all a streaming demo needs. The
build is deterministic (same Python stdlib, same bytes) and takes a few seconds.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import ctranslate2
import numpy as np
import numpy.typing as npt
import sentencepiece as spm
from ctranslate2.specs import transformer_spec

from ops.model_builders import demo_end
from ops.model_builders.demo_corpus import collect_corpus
from ops.model_builders.demo_end import EndCircuit
from worker.engine.model_hints import write_hints

VOCAB_SIZE = 2000
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
UNK_PIECE, BOS_PIECE, EOS_PIECE = "<unk>", "<s>", "</s>"
MODEL_FILE = "model.bin"
TOKENIZER_FILE = "tokenizer.model"
# What a build contains, so an older build gets replaced: 2 has the end-of-turn circuit.
BUILD_FILE = "demo-build.txt"
DEMO_BUILD = "2"


# Add-k smoothing: every transition is possible, unseen ones are ~1e-4/count unlikely.
SMOOTHING_K = 1e-4
# Paragraph ends are down-weighted: the end-of-turn circuit, not the table, ends an answer.
EOS_WEIGHT = 0.02
# The self-check after compiling tolerates float32 rounding only...
MAX_LOGPROB_ERROR = 1e-4
# ...over this many positions of corpus text, well past where the end bias saturates.
VERIFY_TEXT_TOKENS = 512

FloatArray = npt.NDArray[np.float32]


# int8 activations round away the one-hot residual's small terms, which the table relies on:
# quantized, the model emits control bytes and unknown pieces (see worker.engine.model_hints).
DEMO_COMPUTE_TYPE = "float32"
DEMO_COMPUTE_WHY = "exact bigram table; int8 activation quantization breaks it"


def demo_model_ready(output_dir: Path) -> bool:
    """Whether a finished demo model is at ``output_dir`` (builds publish atomically)."""
    return (output_dir / MODEL_FILE).is_file() and (output_dir / TOKENIZER_FILE).is_file()


def demo_model_current(output_dir: Path) -> bool:
    """Whether ``output_dir`` holds a demo model this builder made (older ones never end)."""
    try:
        stamp = (output_dir / BUILD_FILE).read_text().strip()
    except OSError:
        return False
    return stamp == DEMO_BUILD and demo_model_ready(output_dir)


def build_demo_model(output_dir: Path, *, force: bool = False) -> Path:
    """Build the demo model into ``output_dir`` unless it is already there; return the path.

    The model is built in a sibling temp dir and renamed into place, so readers never see a
    half-built one. ``force`` replaces whatever ``output_dir`` holds, and so does a build
    this builder did not make.
    """
    output_dir = Path(output_dir)
    if demo_model_current(output_dir) and not force:
        return output_dir
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.build-", dir=output_dir.parent))
    try:
        _build_into(staging)
        publish_model_dir(staging, output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output_dir


def verify_demo_model(model_dir: Path, tokens: Sequence[int] | None = None) -> float:
    """Max abs difference between the model's next-token log-probs and what it was compiled from.

    Recomputes the table from the stdlib corpus and the model's own tokenizer, so it checks the
    published files rather than trusting the build.
    """
    sp = load_tokenizer(model_dir / TOKENIZER_FILE)
    sequences = encode_corpus(sp, collect_corpus())
    table = bigram_log_probs(sequences, sp.get_piece_size())
    generator = ctranslate2.Generator(str(model_dir), device="cpu")
    return max_logprob_error(generator, table, demo_circuit(sp), sequences, tokens)


def demo_circuit(sp: spm.SentencePieceProcessor) -> EndCircuit:
    """The end-of-turn circuit for this tokenizer's pieces."""
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    return EndCircuit(len(pieces), BOS_ID, EOS_ID, demo_end.sentence_end_ids(pieces))


def max_logprob_error(
    generator: ctranslate2.Generator,
    table: FloatArray,
    circuit: EndCircuit,
    sequences: Sequence[npt.NDArray[np.int64]],
    tokens: Sequence[int] | None = None,
) -> float:
    """Compare the model's ``log P(. | context)`` with the table plus the end bias.

    Each of ``tokens`` is checked right after ``<s>`` (no end bias yet), and a long stretch of
    corpus text checks every position where the bias grows and saturates.
    """
    ids = list(tokens) if tokens is not None else _sample_token_ids(table.shape[0])
    text = [BOS_ID, *np.concatenate(sequences)[:VERIFY_TEXT_TOKENS].tolist()]
    error = 0.0
    for batch in ([[BOS_ID, t] for t in ids], [text]):  # apart: the batch pads to its longest
        out = np.asarray(generator.forward_batch(batch, return_log_probs=True), dtype=np.float64)
        for context, model in zip(batch, out, strict=True):
            expected = demo_end.expected_log_probs(table, circuit, context)
            error = max(error, float(np.abs(model - expected).max()))
    return error


def load_tokenizer(path: Path) -> spm.SentencePieceProcessor:
    """Load a SentencePiece model from a file."""
    return spm.SentencePieceProcessor(model_file=str(path))


# --- tokenizer ------------------------------------------------------------------------------


def train_tokenizer(paragraphs: Iterable[str], vocab_size: int = VOCAB_SIZE) -> bytes:
    """Train the SentencePiece model and return its serialized bytes.

    Byte fallback lets any UTF-8 text round-trip; the identity normalizer and kept whitespace
    make decode(encode(text)) == text. Training from an iterator into a buffer keeps temp paths
    out of the serialized trainer spec, so the bytes are reproducible.
    """
    buffer = _BytesSink()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(paragraphs),
        model_writer=buffer,
        vocab_size=vocab_size,
        model_type="unigram",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        pad_id=-1,
        unk_piece=UNK_PIECE,
        bos_piece=BOS_PIECE,
        eos_piece=EOS_PIECE,
        num_threads=1,
        shuffle_input_sentence=False,
        input_sentence_size=0,
        minloglevel=2,
    )
    return buffer.data


class _BytesSink:
    """The ``model_writer`` SentencePiece calls ``write`` on with the whole model."""

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


def encode_corpus(
    sp: spm.SentencePieceProcessor, paragraphs: Sequence[str]
) -> list[npt.NDArray[np.int64]]:
    """Token ids of each paragraph (no BOS/EOS; the bigram counter adds them)."""
    return [np.asarray(ids, dtype=np.int64) for ids in sp.encode(list(paragraphs))]


# --- bigram model ---------------------------------------------------------------------------


def bigram_counts(sequences: Iterable[npt.NDArray[np.int64]], vocab_size: int) -> np.ndarray:
    """``counts[prev, next]`` over ``<s> ids... </s>``, with the end transition down-weighted."""
    prev_parts: list[npt.NDArray[np.int64]] = []
    next_parts: list[npt.NDArray[np.int64]] = []
    for ids in sequences:
        prev_parts.append(np.concatenate(([BOS_ID], ids)))
        next_parts.append(np.concatenate((ids, [EOS_ID])))
    prev = np.concatenate(prev_parts)
    nxt = np.concatenate(next_parts)
    weights = np.where(nxt == EOS_ID, EOS_WEIGHT, 1.0)
    flat = np.bincount(prev * vocab_size + nxt, weights=weights, minlength=vocab_size**2)
    return flat.reshape(vocab_size, vocab_size)


def bigram_log_probs(
    sequences: Iterable[npt.NDArray[np.int64]], vocab_size: int = VOCAB_SIZE
) -> FloatArray:
    """``table[t, v] = log P(v | t)`` with add-k smoothing; unseen contexts use the unigram."""
    counts = bigram_counts(sequences, vocab_size)
    row_totals = counts.sum(axis=1)
    unigram = counts.sum(axis=0)
    counts[row_totals == 0] = unigram
    smoothed = counts + SMOOTHING_K
    probs = smoothed / smoothed.sum(axis=1, keepdims=True)
    table: npt.NDArray[np.float32] = np.log(probs).astype(np.float32)
    return table


def mean_eos_probability(table: FloatArray, sequences: Sequence[npt.NDArray[np.int64]]) -> float:
    """P(</s>) averaged over the contexts the corpus visits (why the table alone rarely ends)."""
    context_ids = np.concatenate([np.concatenate(([BOS_ID], ids)) for ids in sequences])
    return float(np.exp(table[context_ids, EOS_ID].astype(np.float64)).mean())


# --- CTranslate2 compilation ----------------------------------------------------------------


def bigram_spec(
    table: FloatArray, pieces: Sequence[str], circuit: EndCircuit | None = None
) -> transformer_spec.TransformerDecoderModelSpec:
    """A CTranslate2 decoder whose logits after token ``t`` are exactly ``table[t]``.

    With a ``circuit`` (``ops.model_builders.demo_end``) the layer also adds the end-of-turn
    bias to the ``</s>`` logit after sentence ends; without one the layer is inert, which is
    what scripted test models want.
    """
    vocab = table.shape[0]
    d_model = circuit.d_model if circuit else vocab
    decoder = transformer_spec.TransformerDecoderSpec(
        num_layers=1,
        num_heads=1,
        pre_norm=True,
        with_encoder_attention=False,
        no_final_norm=True,
        rotary_dim=0,  # Rotary instead of additive position encodings: embeddings stay one-hot.
        head_dim=demo_end.LAYER_HEAD_DIM,
        num_heads_kv=1,
    )
    decoder.scale_embeddings = False
    embeddings = np.zeros((vocab, d_model), dtype=np.float32)
    embeddings[:, :vocab] = np.eye(vocab, dtype=np.float32)
    decoder.embeddings.weight = embeddings
    projection = np.zeros((vocab, d_model), dtype=np.float32)
    projection[:, :vocab] = table.T
    decoder.projection.bias = np.zeros(vocab, dtype=np.float32)
    if circuit:
        projection[circuit.eos_id, circuit.end_dim] = 1.0
    demo_end.fill_layer(decoder.layer[0], d_model, circuit)
    decoder.projection.weight = projection
    spec = transformer_spec.TransformerDecoderModelSpec(decoder)
    spec.config.unk_token = UNK_PIECE
    spec.config.bos_token = BOS_PIECE
    spec.config.eos_token = EOS_PIECE
    spec.config.layer_norm_epsilon = demo_end.LAYER_NORM_EPSILON
    spec.register_vocabulary(list(pieces))
    spec.validate()
    spec.optimize(quantization="float32")
    return spec


def save_bigram_model(
    table: FloatArray, pieces: Sequence[str], directory: Path, circuit: EndCircuit | None = None
) -> None:
    """Save ``bigram_spec(table, pieces, circuit)`` into ``directory`` with its float32 hint.

    Every bigram model is exact only in float32: under ``auto`` CTranslate2 quantizes to int8
    on CPUs that have it, and whether int8 rounding still keeps a scripted model's greedy path
    depends on the CPU's kernels (a tool script that held on one machine left its script on an
    AVX2-only one). So the hint is written here, with the weights, never by each caller.
    """
    bigram_spec(table, pieces, circuit).save(str(directory))
    write_hints(directory, DEMO_COMPUTE_TYPE, DEMO_COMPUTE_WHY)


# --- build steps ----------------------------------------------------------------------------


def _build_into(staging: Path) -> None:
    """Train, count, compile, save and self-check the model inside ``staging``."""
    paragraphs = collect_corpus()
    sp_bytes = train_tokenizer(paragraphs)
    sp = spm.SentencePieceProcessor(model_proto=sp_bytes)
    sequences = encode_corpus(sp, paragraphs)
    table = bigram_log_probs(sequences, sp.get_piece_size())
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    circuit = demo_circuit(sp)
    save_bigram_model(table, pieces, staging, circuit)
    (staging / TOKENIZER_FILE).write_bytes(sp_bytes)
    (staging / BUILD_FILE).write_text(DEMO_BUILD + "\n")
    generator = ctranslate2.Generator(str(staging), device="cpu")
    error = max_logprob_error(generator, table, circuit, sequences)
    del generator
    if error > MAX_LOGPROB_ERROR:
        raise RuntimeError(f"demo model does not reproduce its bigram table (error {error:g})")


def publish_model_dir(staging: Path, output_dir: Path) -> None:
    """Move a finished build into place, replacing any previous (or partial) one.

    The rename is atomic; when replacing, the old directory is moved aside first, so there is a
    moment with no model at all but never one with a half-written model.
    """
    if output_dir.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.old-", dir=output_dir.parent))
        os.replace(output_dir, trash / output_dir.name)
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rename(staging, output_dir)
    except OSError:
        # Another process published first; its model is as good as ours.
        if not demo_model_ready(output_dir):
            raise


def _sample_token_ids(vocab_size: int) -> list[int]:
    """A spread of token ids for spot checks: specials, bytes and ordinary pieces."""
    return sorted({0, 1, 2, 3, 100, 258, 259, 500, 1000, vocab_size // 2, vocab_size - 1})
