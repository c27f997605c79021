"""Tokenizers: one interface (``Tokenizer``), SentencePiece and Hugging Face behind it, and the
loader that picks one from a model directory (docs/architecture.md#tokenizers)."""

from trickle.tokenization.interface import Tokenizer
from trickle.tokenization.loading import load_tokenizer

__all__ = ["Tokenizer", "load_tokenizer"]
