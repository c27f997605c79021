"""Hugging Face tokenizer.json fixtures.

A byte-level BPE tokenizer, laid out as ``ct2-transformers-converter --copy_files tokenizer.json
tokenizer_config.json generation_config.json`` leaves a Llama 3, Qwen or SmolLM2 model: trained
here, deterministically, with the ``tokenizers`` trainer (ByteLevel pre-tokenizer and decoder,
ChatML's special tokens) on the demo model's corpus (stdlib docstrings) plus text with accents,
emoji, CJK and code, so those have merged tokens and split ones. And a SentencePiece model
converted to a Llama 2-style tokenizer.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)

from ops.model_builders.demo_corpus import collect_corpus

VOCAB_SIZE = 1024
CORPUS_CHARS = 200_000
END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END]
MULTILINGUAL = (
    "Café, naïve façade, résumé, déjà vu: «Straße» über Öl — “quoted” … ½ ± ≠ €5.",
    "Emoji: 😀 🎉 👩‍💻 🇫🇷 ❤️ ✨ 🚀 and a thumbs up 👍🏽.",
    "中文字符测试，你好世界。日本語のテキスト、こんにちは。한국어 텍스트 안녕하세요.",  # noqa: RUF001
    "Ελληνικά κείμενα, русский текст, עברית, العربية, हिन्दी.",
    'def greet(name: str) -> str:\n    return f"Hello, {name}!"  # ✓\n',
    "for (int i = 0; i < n; ++i) { sum += a[i]; }\n\tif x != 0 && y >= 1: pass",
)
# Hugging Face's ChatML template, as SmolLM2 and Qwen ship it (without a default system prompt).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def training_text() -> list[str]:
    """The corpus: docstring paragraphs, then the multilingual lines many times over (so their
    characters merge into tokens of their own, as in a real model's vocabulary)."""
    return [*collect_corpus(CORPUS_CHARS), *MULTILINGUAL * 30]


def train_bpe(vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(), trainer)
    return tokenizer


def write_bpe_tokenizer(directory: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """The three files a converted model carries; returns ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = train_bpe(vocab_size)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": IM_START,
        "eos_token": IM_END,
        "unk_token": END_OF_TEXT,
        "pad_token": IM_END,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    ends = [tokenizer.token_to_id(IM_END), tokenizer.token_to_id(END_OF_TEXT)]
    generation = {"bos_token_id": tokenizer.token_to_id(IM_START), "eos_token_id": ends}
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return directory


def write_sentencepiece_style(sentencepiece_model: Path, path: Path) -> Path:
    """A SentencePiece model as a Llama 2-style tokenizer.json: its pieces and scores as a
    Unigram with byte fallback, the dummy-prefix space as a normalizer, and Llama 2's decoder
    (``▁`` to a space, byte pieces to bytes, fused, the first space stripped)."""
    from sentencepiece import sentencepiece_model_pb2

    proto: Any = sentencepiece_model_pb2.ModelProto()  # generated code, without type stubs
    proto.ParseFromString(sentencepiece_model.read_bytes())
    control = {proto.SentencePiece.CONTROL, proto.SentencePiece.UNKNOWN}
    vocab = [(piece.piece, piece.score) for piece in proto.pieces]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("\u2581", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    specials = [piece.piece for piece in proto.pieces if piece.type in control]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path
