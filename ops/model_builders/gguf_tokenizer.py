"""The Hugging Face tokenizer files of a GGUF model, written from the GGUF's own metadata.

A GGUF file carries its whole tokenizer (``tokenizer.ggml.*``: tokens in id order, BPE merges,
token types, special ids) and its chat template; a served model needs them as the files
``ct2-transformers-converter --copy_files`` would copy from a Hugging Face checkout:
``tokenizer.json`` (built with the ``tokenizers`` library, so it is that library's own format),
``tokenizer_config.json`` (chat template, start and end tokens, ``add_bos_token``) and
``generation_config.json`` (the ids that end a turn).

Control tokens (``<|im_start|>``, ``<|im_end|>``) become added special tokens: a chat prompt's
``<|im_end|>`` must encode to its one id, never to the characters ``<``, ``|``, ``im``...;
split, the model never sees the end of a turn and rambles on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gguf import GGUFReader, TokenType
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"

# llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) whose split this module reproduces: the
# GPT-2 regex, after single digits for the StarCoder family (SmolLM's vocabulary).
GPT2_PRE = frozenset({"gpt2"})
DIGITS_THEN_GPT2_PRE = frozenset({"smollm", "starcoder", "refact", "codeshell"})
# Tokens that end a turn in common chat templates; those in the vocabulary join the file's eos.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


@dataclass(frozen=True)
class GgufVocabulary:
    """What ``tokenizer.ggml.*`` says, checked."""

    tokens: list[str]
    merges: list[tuple[str, str]]
    token_types: list[int]
    pre_tokenizer: str
    bos_id: int
    eos_id: int
    unk_id: int | None
    add_bos: bool
    chat_template: str

    @property
    def bos_token(self) -> str:
        return self.tokens[self.bos_id]

    @property
    def eos_token(self) -> str:
        return self.tokens[self.eos_id]

    @property
    def unk_token(self) -> str:
        return "" if self.unk_id is None else self.tokens[self.unk_id]

    def special_tokens(self) -> list[str]:
        """Control and user-defined tokens, in id order: each must stay one id."""
        kept = (TokenType.CONTROL, TokenType.USER_DEFINED)
        return [t for t, kind in zip(self.tokens, self.token_types, strict=True) if kind in kept]

    def end_token_ids(self) -> list[int]:
        """The file's end token, then every end-of-turn token the vocabulary has."""
        ids = {token: index for index, token in enumerate(self.tokens)}
        found = [ids[t] for t in END_OF_TURN_TOKENS if t in ids and t in self.special_tokens()]
        return list(dict.fromkeys([self.eos_id, *found]))


def read_vocabulary(reader: GGUFReader) -> GgufVocabulary:
    """The file's byte-level BPE vocabulary, or a ``ValueError`` naming what is unusable."""
    where = reader.data.filename

    def value(key: str, default: object = None) -> object:
        field = reader.fields.get(key)
        if field is None:
            if default is None:
                raise ValueError(f"{where}: tokenizer metadata {key!r} is missing")
            return default
        return field.contents()

    kind = value("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"{where}: tokenizer {kind!r} is not supported (only byte-level BPE, 'gpt2')"
        )
    pre = str(value("tokenizer.ggml.pre", "gpt2"))
    if pre not in GPT2_PRE | DIGITS_THEN_GPT2_PRE:
        raise ValueError(f"{where}: pre-tokenizer {pre!r} is not supported")
    tokens = [str(t) for t in _as_list(value("tokenizer.ggml.tokens"))]
    types = [int(str(t)) for t in _as_list(value("tokenizer.ggml.token_type"))]
    merges = [_merge(str(m), where) for m in _as_list(value("tokenizer.ggml.merges"))]
    if len(types) != len(tokens):
        raise ValueError(f"{where}: {len(tokens)} tokens but {len(types)} token types")
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"{where}: tokenizer.ggml.tokens has duplicate tokens")

    def token_id(key: str, required: bool) -> int | None:
        found = reader.fields.get(key)
        if found is None:
            if required:
                raise ValueError(f"{where}: tokenizer metadata {key!r} is missing")
            return None
        index = int(found.contents())
        if not 0 <= index < len(tokens):
            raise ValueError(f"{where}: {key} {index} is outside the vocabulary")
        return index

    bos = token_id("tokenizer.ggml.bos_token_id", True)
    eos = token_id("tokenizer.ggml.eos_token_id", True)
    assert bos is not None and eos is not None  # required above
    return GgufVocabulary(
        tokens=tokens,
        merges=merges,
        token_types=types,
        pre_tokenizer=pre,
        bos_id=bos,
        eos_id=eos,
        unk_id=token_id("tokenizer.ggml.unknown_token_id", False),
        add_bos=bool(value("tokenizer.ggml.add_bos_token", False)),
        chat_template=str(value("tokenizer.chat_template", "")),
    )


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _merge(text: str, where: object) -> tuple[str, str]:
    left, sep, right = text.partition(" ")
    if not sep or not left or not right or " " in right:
        raise ValueError(f"{where}: BPE merge {text!r} is not two tokens")
    return left, right


def build_tokenizer(vocab: GgufVocabulary, where: str) -> Tokenizer:
    """The ``tokenizers`` tokenizer: byte-level BPE, specials added whole."""
    bpe = models.BPE(
        vocab={token: index for index, token in enumerate(vocab.tokens)},
        merges=vocab.merges,
        fuse_unk=False,
        byte_fallback=False,
    )
    tokenizer = Tokenizer(bpe)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if vocab.pre_tokenizer in DIGITS_THEN_GPT2_PRE:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    if vocab.add_bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{vocab.bos_token} $A",
            pair=f"{vocab.bos_token} $A {vocab.bos_token} $B:1",
            special_tokens=[(vocab.bos_token, vocab.bos_id)],
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in vocab.special_tokens()]
    )
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size != len(vocab.tokens):
        raise ValueError(
            f"{where}: the tokenizer has {size} ids, the vocabulary {len(vocab.tokens)}"
        )
    return tokenizer


def write_tokenizer_files(
    output_dir: Path, tokenizer: Tokenizer, vocab: GgufVocabulary, context_length: int
) -> None:
    """``tokenizer.json``, ``tokenizer_config.json`` and ``generation_config.json``."""
    tokenizer.save(str(output_dir / TOKENIZER_JSON))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": vocab.bos_token,
        "eos_token": vocab.eos_token,
        "unk_token": vocab.unk_token or None,
        "pad_token": vocab.eos_token,
        "add_bos_token": vocab.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
        "chat_template": vocab.chat_template or None,
    }
    _write_json(output_dir / TOKENIZER_CONFIG, {k: v for k, v in config.items() if v is not None})
    generation = {
        "bos_token_id": vocab.bos_id,
        "eos_token_id": vocab.end_token_ids(),
        "pad_token_id": vocab.eos_id,
    }
    _write_json(output_dir / GENERATION_CONFIG, generation)


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
