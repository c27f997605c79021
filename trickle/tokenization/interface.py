"""The one tokenizer interface the web tier and the engine share, whatever the model ships.

A model directory brings SentencePiece (``tokenizer.model``) or Hugging Face (``tokenizer.json``,
byte-level BPE or SentencePiece-style); ``trickle.tokenization.loading`` picks the
implementation from its files. Callers see ids, the strings CTranslate2's vocabulary holds for
them, text, and each id's exact bytes: the detokenizer, stop strings, logprobs, token counts,
the context limit, the prefix cache and the grammar matcher need nothing more.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

# How a grammar matcher (llguidance) marks a special token's bytes: no text can produce 0xFF.
SPECIAL_MARK = b"\xff"


class Tokenizer(ABC):
    """Text to ids and back for one model, with its start and end tokens.

    ``bos_id``/``eos_id``/``unk_id`` are -1 where the tokenizer has none; ``end_ids`` are every
    id that ends generation (the loader adds the model's own end tokens); ``vocab_size`` is the
    number of ids the tokenizer knows (a model's padded output layer may have more).
    """

    vocab_size: int
    bos_id: int
    eos_id: int
    unk_id: int
    add_bos: bool
    end_ids: frozenset[int]
    # Ids with no text (control pieces, Hugging Face's special tokens): decoded as nothing.
    special_ids: frozenset[int]
    # The tokenizer.json text, for libraries that read a Hugging Face tokenizer themselves
    # (llguidance); None for SentencePiece.
    huggingface_json: str | None = None

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Prompt ids as the model sees them (with the start token when the model wants one)."""

    @abstractmethod
    def encode_text(self, text: str) -> list[int]:
        """Ids whose bytes (``token_bytes``) spell exactly ``text``: no start token, no added
        leading space (what a grammar replays)."""

    @abstractmethod
    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``; special tokens have none, an incomplete UTF-8 character at the
        end decodes as U+FFFD (the detokenizer holds such text back)."""

    @abstractmethod
    def to_pieces(self, ids: list[int]) -> list[str]:
        """The strings CTranslate2's vocabulary holds for ``ids`` (its prompt input)."""

    @abstractmethod
    def piece_id(self, piece: str) -> int:
        """The id of a vocabulary string (a special token's name included); -1 if none."""

    @abstractmethod
    def token_bytes(self) -> list[bytes]:
        """Every id's bytes in id order, as a grammar matcher sees the vocabulary: the bytes the
        id adds to a text, or a special token's name behind ``SPECIAL_MARK``."""

    def count(self, text: str) -> int:
        """How many ids the prompt ``text`` takes (usage, count_tokens, the context limit)."""
        return len(self.encode(text))

    @property
    def reads_special_text(self) -> bool:
        """Whether a special token written as text in a prompt (``<|im_start|>``) encodes as its
        one id. SentencePiece never does: its start token must come as an id."""
        return False

    @property
    def drops_template_bos(self) -> bool:
        """Whether a chat template's leading start-token text is dropped from the prompt: where
        the tokenizer adds the start token itself, or cannot read it from text."""
        return self.add_bos or not self.reads_special_text

    def _in_vocabulary(self, ids: list[int], unknown: int) -> list[int]:
        """Ids past the tokenizer's (a padded output layer) as ``unknown``; -1 drops them."""
        if not ids or (min(ids) >= 0 and max(ids) < self.vocab_size):
            return ids  # the usual case (this runs twice per generated token)
        if unknown < 0:
            return [i for i in ids if 0 <= i < self.vocab_size]
        return [i if 0 <= i < self.vocab_size else unknown for i in ids]
