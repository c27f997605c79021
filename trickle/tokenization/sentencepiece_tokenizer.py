"""SentencePiece (``tokenizer.model``): the demo model's tokenizer and Llama 2-era models'."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import sentencepiece as spm

from trickle.tokenization.interface import SPECIAL_MARK, Tokenizer
from trickle.tokenization.piece_bytes import SPACE  # SentencePiece's word-boundary marker


class SentencePieceTokenizer(Tokenizer):
    """Encodes prompts to the pieces CTranslate2 expects and decodes ids back to text."""

    def __init__(self, model_path: str | Path, add_bos: bool = True):
        path = Path(model_path)
        if not path.is_file():
            raise ValueError(f"tokenizer model {path} does not exist; build it or fix the config")
        self._sp = spm.SentencePieceProcessor(model_file=str(path))
        self.add_bos = add_bos
        self.bos_id = self._sp.bos_id()
        self.eos_id = self._sp.eos_id()
        self.vocab_size = self._sp.get_piece_size()
        self.unk_id = self._sp.unk_id()
        self._decode_ids = _fast_decoder(self._sp)
        self.end_ids = frozenset([self.eos_id] if self.eos_id >= 0 else [])
        self.special_ids = frozenset(
            i for i in range(self.vocab_size) if self._sp.is_control(i) or self._sp.is_unknown(i)
        )

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._sp.encode(text, out_type=int)
        if self.add_bos and self.bos_id >= 0:
            ids = [self.bos_id, *ids]
        return ids

    def to_pieces(self, ids: list[int]) -> list[str]:
        return [self._sp.id_to_piece(i) for i in self._in_vocabulary(ids, self.unk_id)]

    def piece_id(self, piece: str) -> int:
        found = int(self._sp.piece_to_id(piece))
        return -1 if found == self.unk_id and piece != self._sp.id_to_piece(found) else found

    def token_bytes(self) -> list[bytes]:
        """A control or unknown piece is its name behind the special mark; ``_spell`` says the
        rest."""
        sp = self._sp
        return [
            SPECIAL_MARK + sp.id_to_piece(i).encode()
            if sp.is_control(i) or sp.is_unknown(i)
            else self._spell([i])
            for i in range(self.vocab_size)
        ]

    def encode_text(self, text: str) -> list[int]:
        """SentencePiece's encoding with its dummy-prefix space taken off the first piece, or
        byte pieces where that does not spell ``text``."""
        ids: list[int] = self._sp.encode(text, out_type=int)
        wanted = text.encode()
        spelled = self._spell(ids)
        if spelled == wanted:
            return ids
        if ids and spelled == b" " + wanted:
            bare = self._sp.id_to_piece(ids[0])[1:]
            if not bare:
                return ids[1:]
            bare_id = self._sp.piece_to_id(bare)
            head = [bare_id] if bare_id != self.unk_id else self._byte_ids(bare)
            if self._spell(head + ids[1:]) == wanted:
                return head + ids[1:]
        return self._byte_ids(text)

    def _spell(self, ids: list[int]) -> bytes:
        """The bytes ``ids`` add to a text: ``\u2581`` is a space, a byte-fallback piece its
        byte."""
        sp = self._sp
        return b"".join(
            bytes([int(sp.id_to_piece(i)[3:5], 16)])
            if sp.is_byte(i)
            else sp.id_to_piece(i).replace(SPACE, " ").encode()
            for i in ids
        )

    def _byte_ids(self, text: str) -> list[int]:
        return [self._sp.piece_to_id(f"<0x{byte:02X}>") for byte in text.encode()]

    def decode(self, ids: list[int]) -> str:
        return str(self._decode_ids(self._in_vocabulary(ids, self.unk_id)))


def _fast_decoder(sp: Any) -> Callable[[list[int]], str]:
    """SentencePiece's C++ ``DecodeIds`` without its Python wrapper, which checks the input's
    type and shape on every call (docs/performance.md), and the detokenizer decodes twice per
    generated token. It is a private attribute of the package (sentencepiece 0.2.1+), so it is
    used only where it exists, ``decode`` is the package's own, and the two agree on every
    piece; otherwise ``decode``."""
    fast = getattr(getattr(sp, "_processor", None), "_DecodeIds", None)
    if fast is None or type(sp).decode is not type(sp).Decode:
        # No such method, or ``decode`` was replaced (instrumented, as the fault-injection
        # tests do): then ``decode`` it is.
        return sp.decode  # type: ignore[no-any-return]
    sample = list(range(sp.get_piece_size()))
    try:
        agrees = fast(sample) == sp.decode(sample) and fast([]) == sp.decode([])
    except (TypeError, RuntimeError):
        agrees = False
    return fast if agrees else sp.decode  # type: ignore[no-any-return]
