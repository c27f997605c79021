"""The models a run can measure: the demo bigram model and random-weight Llama-style ones.

Every model is built offline (no download) and cached under ``models/`` (gitignored); a cached
random model is reused only when it was built with the same shape.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from trickle.config.settings import DEFAULT_MODEL_DIR, PROJECT_ROOT
from trickle.tokenization.sentencepiece_tokenizer import SentencePieceTokenizer

MODELS_DIR = PROJECT_ROOT / "models"
TOKENIZER_FILE = "tokenizer.model"
# A short fixed prompt, the same for the engine and for every Trickle job.
PROMPT = "The socket module"


@dataclass(frozen=True)
class LlamaShape:
    d_model: int
    num_layers: int
    num_heads: int
    ffn_dim: int
    vocab_size: int
    quantization: str

    @property
    def parameters(self) -> int:
        """Embeddings + output projection + per layer (fused QKV, output, gated FFN) + norms."""
        d, f = self.d_model, self.ffn_dim
        per_layer = 4 * d * d + 3 * d * f + 2 * d
        return 2 * self.vocab_size * d + self.num_layers * per_layer + d


@dataclass(frozen=True)
class ModelChoice:
    key: str
    directory: str  # under models/
    shape: LlamaShape | None  # None: the demo model
    description: str


CHOICES: dict[str, ModelChoice] = {
    "demo": ModelChoice(
        "demo",
        "demo",
        None,
        "the demo bigram model (1 layer, d_model 2000 one-hot, vocab 2000, float32)",
    ),
    "bench": ModelChoice(
        "bench",
        "bench-33m",
        LlamaShape(512, 8, 8, 1376, 8000, "int8"),
        "random Llama-style, d_model 512, 8 layers, 8 heads, ffn 1376, vocab 8000, int8",
    ),
    # The issue 41 class of model: a 128-token job runs about 1 s alone on a CPU core, so a
    # newcomer that waits for a lane to free waits about that long.
    "46m": ModelChoice(
        "46m",
        "bench-46m",
        LlamaShape(640, 7, 10, 1728, 8000, "int8"),
        "random Llama-style, d_model 640, 7 layers, 10 heads, ffn 1728, vocab 8000, int8",
    ),
    # The 46M model of the outside measurements (issue 53, bench.outside): about 115 tokens/s
    # alone here, so a 128-token job runs about 1.1 s.
    "46m-outside": ModelChoice(
        "46m-outside",
        "bench-46m-outside",
        LlamaShape(512, 12, 8, 1536, 6000, "int8"),
        "random Llama-style, d_model 512, 12 layers, 8 heads, ffn 1536, vocab 6000, int8",
    ),
    "gpt2": ModelChoice(
        "gpt2",
        "bench-gpt2",
        LlamaShape(768, 12, 12, 3072, 8000, "int8"),
        "random Llama-style at GPT-2-small size, d_model 768, 12 layers, 12 heads, ffn 3072 "
        "(gated, 3 matrices), vocab 8000, int8",
    ),
}


@dataclass(frozen=True)
class PreparedModel:
    choice: ModelChoice
    path: Path
    parameters: int

    @property
    def key(self) -> str:
        return self.choice.key

    @property
    def tokenizer_path(self) -> Path:
        return self.path / TOKENIZER_FILE


def prepare(key: str, vocab_size: int | None = None) -> PreparedModel:
    """Build (or reuse) the model for ``key`` and return where it is.

    ``vocab_size`` overrides a random model's vocabulary (e.g. 2000, the tokenizer's own size,
    so that no id decodes to an ``<extra_N>`` piece); such a model gets its own directory.
    """
    from ops.model_builders.demo import build_demo_model

    choice = CHOICES[key]
    if choice.shape is not None and vocab_size and vocab_size != choice.shape.vocab_size:
        shape = dataclasses.replace(choice.shape, vocab_size=vocab_size)
        choice = ModelChoice(
            key,
            f"{choice.directory}-v{vocab_size}",
            shape,
            choice.description.replace(f"vocab {choice.shape.vocab_size}", f"vocab {vocab_size}"),
        )
    demo_dir = build_demo_model(DEFAULT_MODEL_DIR)
    if choice.shape is None:
        # One-hot embeddings and the output projection, each vocab x vocab; the layer is tiny.
        vocab = SentencePieceTokenizer(demo_dir / TOKENIZER_FILE).vocab_size
        return PreparedModel(choice, demo_dir, 2 * vocab * vocab)
    from ops.model_builders.random_llama import build_random_llama

    shape = choice.shape
    path = build_random_llama(
        MODELS_DIR / choice.directory,
        demo_dir / TOKENIZER_FILE,
        d_model=shape.d_model,
        num_layers=shape.num_layers,
        num_heads=shape.num_heads,
        ffn_dim=shape.ffn_dim,
        vocab_size=shape.vocab_size,
        quantization=shape.quantization,
    )
    return PreparedModel(choice, path, shape.parameters)


def at_path(path: Path) -> PreparedModel:
    """A model built elsewhere (the default model's directory, say), run as it is: its own
    tokenizer (``tokenizer.json`` or ``tokenizer.model``) encodes the prompt."""
    resolved = path.resolve()
    choice = ModelChoice(resolved.name, str(resolved), None, f"the model at {resolved}")
    return PreparedModel(choice, resolved, 0)


def prompt_pieces(model: PreparedModel, text: str = PROMPT) -> list[str]:
    """The prompt's pieces as the stack feeds them (its tokenizer as the worker loads it:
    SentencePiece or Hugging Face, the profile's start token)."""
    from trickle.config.sections import ModelSettings
    from trickle.tokenization.loading import load_tokenizer

    tokenizer = load_tokenizer(ModelSettings(name=model.key, path=str(model.path)))
    return tokenizer.to_pieces(tokenizer.encode(text))
