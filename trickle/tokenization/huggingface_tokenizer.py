"""Hugging Face tokenizers (``tokenizer.json``, the ``tokenizers`` library): byte-level BPE as
most instruct models ship it, or SentencePiece-style.

Added and special tokens are single ids, in prompts too: ``<|im_start|>`` written by a chat
template encodes as its one id, never as characters. Special tokens decode to nothing (as
SentencePiece's control pieces do, and as Hugging Face's ``skip_special_tokens``); each id's
exact bytes come from the decoder's family (``trickle.tokenization.piece_bytes``).
"""

from __future__ import annotations

import codecs
import itertools
import json
from pathlib import Path

import tokenizers

from trickle.tokenization.interface import SPECIAL_MARK, Tokenizer
from trickle.tokenization.piece_bytes import SPACE, speller

# SentencePiece's rule for bytes that form no character: one U+FFFD per byte (Python's
# "replace" gives one per maximal invalid sequence, so a cut 3-byte character is one).
BYTEWISE = "trickle-bytewise-replace"


def _bytewise(error: UnicodeError) -> tuple[str, int]:
    assert isinstance(error, UnicodeDecodeError)
    return "\ufffd" * (error.end - error.start), error.end


codecs.register_error(BYTEWISE, _bytewise)


class HuggingFaceTokenizer(Tokenizer):
    """One ``tokenizer.json``; ``bos_token``/``eos_token`` are the names tokenizer_config.json
    gives (ignored where the vocabulary lacks them). ``add_bos`` None: the start token is added
    when the tokenizer's own post-processor adds one (Llama 3 does, Qwen and SmolLM2 do not)."""

    def __init__(
        self,
        path: str | Path,
        add_bos: bool | None = None,
        bos_token: str = "",
        eos_token: str = "",
    ):
        path = Path(path)
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises bare Exceptions for a bad file
            raise ValueError(f"{path} is not a readable Hugging Face tokenizer: {exc}") from exc
        backend.no_padding()
        backend.no_truncation()
        self._backend = backend
        self.huggingface_json = backend.to_str()
        vocabulary = backend.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocabulary.values(), default=-1) + 1
        self._pieces = [""] * self.vocab_size
        for piece, index in vocabulary.items():
            self._pieces[index] = piece
        added = backend.get_added_tokens_decoder()
        # Special tokens, and any id the file skips (a hole in the numbering): no text.
        holes = frozenset(range(self.vocab_size)) - frozenset(vocabulary.values())
        self.special_ids = frozenset(i for i, token in added.items() if token.special) | holes
        self._added_ids = frozenset(added)
        decoder = backend.decoder
        spelling = speller(json.loads(decoder.__getstate__()) if decoder is not None else None)
        self._spell = spelling.spell
        self._bytes = self._vocabulary_bytes()
        # SentencePiece-style text is decoded here, as SentencePiece does: the library's
        # ByteFallback decoder turns every byte of a run that holds invalid UTF-8 into U+FFFD,
        # valid ones too, so a later byte would change text already streamed.
        self._text_bytes: list[bytes] | None = None
        self._strips_first_space = spelling.strips_first_space
        if spelling.sentencepiece_style:
            self._text_bytes = [
                b"" if index in self.special_ids else spelled
                for index, spelled in enumerate(self._bytes)
            ]
        self._byte_ids = self._single_byte_ids()
        leading = backend.encode("", add_special_tokens=True).ids
        self.bos_id = self.piece_id(bos_token) if bos_token else -1
        if self.bos_id < 0 and leading:
            self.bos_id = leading[0]
        self.add_bos = bool(leading) if add_bos is None else add_bos
        self.eos_id = self.piece_id(eos_token) if eos_token else -1
        self.unk_id = _unknown_id(backend)
        self.end_ids = frozenset([self.eos_id] if self.eos_id >= 0 else [])

    @property
    def reads_special_text(self) -> bool:
        return True

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._backend.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_id >= 0:
            ids = [self.bos_id, *ids]
        return ids

    def encode_text(self, text: str) -> list[int]:
        """The tokenizer's own ids when they spell ``text``; where a SentencePiece-style
        normalizer prepended a space, the first id without it; else one id per byte."""
        ids: list[int] = self._backend.encode(text, add_special_tokens=False).ids
        wanted = text.encode()
        spelled = b"".join(self._bytes[i] for i in ids)
        if spelled == wanted:
            return ids
        if ids and spelled == b" " + wanted:
            bare = self._pieces[ids[0]][1:]
            bare_id = self.piece_id(bare) if bare else -1
            head = [bare_id] if bare_id >= 0 else self._spelled_by_bytes(bare.replace(SPACE, " "))
            if b"".join(self._bytes[i] for i in [*head, *ids[1:]]) == wanted:
                return [*head, *ids[1:]]
        return self._spelled_by_bytes(text) or ids

    def _spelled_by_bytes(self, text: str) -> list[int]:
        """One id per byte of ``text``; empty where the vocabulary lacks a byte."""
        ids = [self._byte_ids.get(byte, -1) for byte in text.encode()]
        return [] if -1 in ids else ids

    def decode(self, ids: list[int]) -> str:
        ids = self._in_vocabulary(ids, -1)
        if self._text_bytes is None:
            return str(self._backend.decode(ids, skip_special_tokens=True))
        spelled = self._text_bytes
        if self.special_ids.isdisjoint(ids):
            text = b"".join([spelled[i] for i in ids]).decode("utf-8", BYTEWISE)
        else:  # as in SentencePiece, a special token ends a run of bytes
            special = self.special_ids.__contains__
            text = "".join(
                b"".join([spelled[i] for i in run]).decode("utf-8", BYTEWISE)
                for is_special, run in itertools.groupby(ids, special)
                if not is_special
            )
        if self._strips_first_space and text[:1] == " ":
            # The space a normalizer prepended (the first piece's marker), not a space byte.
            first = next((i for i in ids if i not in self.special_ids), -1)
            if self._pieces[first].startswith(SPACE):
                return text[1:]
        return text

    def to_pieces(self, ids: list[int]) -> list[str]:
        pieces = self._pieces
        return [pieces[i] for i in self._in_vocabulary(ids, -1)]

    def piece_id(self, piece: str) -> int:
        found = self._backend.token_to_id(piece)
        return -1 if found is None else int(found)

    def token_bytes(self) -> list[bytes]:
        return list(self._bytes)

    def _vocabulary_bytes(self) -> list[bytes]:
        """Each id's bytes: a special token's name behind the mark, an added token's own text
        (the decoder passes it through), a vocabulary string by the decoder's family."""
        out: list[bytes] = []
        for index, piece in enumerate(self._pieces):
            if index in self.special_ids:
                out.append(SPECIAL_MARK + piece.encode())
            elif index in self._added_ids:
                out.append(piece.encode())
            else:
                out.append(self._spell(piece))
        return out

    def _single_byte_ids(self) -> dict[int, int]:
        """An id for each byte a vocabulary string stands for alone (byte-level BPE has all
        256; SentencePiece-style ones their ``<0xAB>`` pieces)."""
        found: dict[int, int] = {}
        not_spelled = self._added_ids | self.special_ids
        for index, spelled in enumerate(self._bytes):
            if len(spelled) == 1 and index not in not_spelled:
                found.setdefault(spelled[0], index)
        return found


def _unknown_id(backend: tokenizers.Tokenizer) -> int:
    """The model's unknown token (BPE and WordPiece name it, Unigram gives its id); -1: none."""
    model = backend.model
    name = getattr(model, "unk_token", None)
    if isinstance(name, str):
        found = backend.token_to_id(name)
        return -1 if found is None else int(found)
    if type(model).__name__ == "Unigram":
        unknown = json.loads(model.__getstate__()).get("unk_id")
        return unknown if isinstance(unknown, int) else -1
    return -1
