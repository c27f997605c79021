"""Hugging Face tokenizers (``tokenizer.json``, the ``tokenizers`` library): byte-level BPE as
most instruct models ship it, or SentencePiece-style.

Added and special tokens are single ids, in prompts too: ``<|im_start|>`` written by a chat
template encodes as its one id, never as characters. Special tokens decode to nothing (as
SentencePiece's control pieces do, and as Hugging Face's ``skip_special_tokens``); each id's
exact bytes come from the decoder's family (``trickle.tokenization.piece_bytes``).
"""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers

from trickle.tokenization.interface import SPECIAL_MARK, Tokenizer
from trickle.tokenization.piece_bytes import speller


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
        described = json.loads(self.huggingface_json)
        vocabulary = backend.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocabulary.values(), default=-1) + 1
        self._pieces = [""] * self.vocab_size
        for piece, index in vocabulary.items():
            self._pieces[index] = piece
        added = backend.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, token in added.items() if token.special)
        self._added_ids = frozenset(added)
        self._spell = speller(described.get("decoder"))
        self._bytes = self._vocabulary_bytes(frozenset(vocabulary.values()))
        self._byte_ids = self._single_byte_ids()
        leading = backend.encode("", add_special_tokens=True).ids
        self.bos_id = self.piece_id(bos_token) if bos_token else -1
        if self.bos_id < 0 and leading:
            self.bos_id = leading[0]
        self.add_bos = bool(leading) if add_bos is None else add_bos
        self.eos_id = self.piece_id(eos_token) if eos_token else -1
        self.unk_id = self.piece_id(str((described.get("model") or {}).get("unk_token") or ""))
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
        """The tokenizer's own ids when they spell ``text`` (no prefix space was added), else
        one id per byte."""
        ids: list[int] = self._backend.encode(text, add_special_tokens=False).ids
        wanted = text.encode()
        if b"".join(self._bytes[i] for i in ids) == wanted:
            return ids
        spelled = [self._byte_ids.get(byte, -1) for byte in wanted]
        return spelled if -1 not in spelled else ids

    def decode(self, ids: list[int]) -> str:
        return str(self._backend.decode(self._in_vocabulary(ids, -1), skip_special_tokens=True))

    def to_pieces(self, ids: list[int]) -> list[str]:
        pieces = self._pieces
        return [pieces[i] for i in self._in_vocabulary(ids, -1)]

    def piece_id(self, piece: str) -> int:
        found = self._backend.token_to_id(piece)
        return -1 if found is None else int(found)

    def token_bytes(self) -> list[bytes]:
        return list(self._bytes)

    def _vocabulary_bytes(self, present: frozenset[int]) -> list[bytes]:
        """Each id's bytes: a special token's name behind the mark, an added token's own text
        (the decoder passes it through), a vocabulary string by the decoder's family. An id
        the file skips (a hole in the numbering) is a special token with no name."""
        out: list[bytes] = []
        for index, piece in enumerate(self._pieces):
            if index in self.special_ids or index not in present:
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
        for index, spelled in enumerate(self._bytes):
            if len(spelled) == 1 and index not in self._added_ids:
                found.setdefault(spelled[0], index)
        return found
