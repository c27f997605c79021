"""A model's tokenizer, chosen from its directory's files, checked against its vocabulary.

``models.<name>.tokenizer`` names the file when set. Otherwise the directory decides:
``tokenizer.json`` (Hugging Face, what ``ct2-transformers-converter --copy_files`` and
transformers' fast tokenizers use, added tokens included) before ``tokenizer.model``
(SentencePiece). A directory with neither, or a tokenizer whose ids are not the strings the
model's ``vocabulary.json`` holds, fails at load with a message naming the directory: a model
served with another tokenizer would answer garbage.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from trickle.config.sections import ModelSettings
from trickle.model_files import model_profile
from trickle.tokenization.huggingface_tokenizer import HuggingFaceTokenizer
from trickle.tokenization.interface import Tokenizer
from trickle.tokenization.sentencepiece_tokenizer import SentencePieceTokenizer

HUGGINGFACE_FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "tokenizer.model"
# Where CTranslate2's converters write a decoder's vocabulary (one string per id).
VOCABULARY_FILES = ("vocabulary.json", "vocabulary.txt")


def tokenizer_file(model: ModelSettings) -> Path:
    """The tokenizer file the model is served with."""
    if model.tokenizer:
        return Path(model.tokenizer)
    directory = Path(model.path)
    for name in (HUGGINGFACE_FILE, SENTENCEPIECE_FILE):
        if (directory / name).is_file():
            return directory / name
    raise ValueError(
        f"model {model.name!r}: {directory} has no tokenizer: put the model's {HUGGINGFACE_FILE} "
        f"(Hugging Face) or {SENTENCEPIECE_FILE} (SentencePiece) beside model.bin, or name one "
        f"in models.{model.name}.tokenizer"
    )


@functools.lru_cache(maxsize=16)
def load_tokenizer(model: ModelSettings) -> Tokenizer:
    """The model's tokenizer, adding the start token as its files say, and ending on the tokens
    its configuration or files name (generation_config.json's eos_token_id, and
    tokenizer_config.json's eos_token when it names a token). One per process and model: the
    web tier's chat templates, prompt limits and grammar checks share it; callers only read
    it."""
    profile = model_profile(model)
    path = tokenizer_file(model)
    tokenizer: Tokenizer
    if path.suffix == ".json":
        tokenizer = HuggingFaceTokenizer(
            path, profile.add_bos, profile.bos_token, profile.eos_token
        )
    else:
        add_bos = True if profile.add_bos is None else profile.add_bos
        tokenizer = SentencePieceTokenizer(path, add_bos=add_bos)
    check_vocabulary(tokenizer, model, path)
    ids = {*tokenizer.end_ids, *profile.end_token_ids}
    for name in profile.end_token_names:
        named = tokenizer.piece_id(name) if name else -1
        if named >= 0 and named != tokenizer.unk_id:
            ids.add(named)
    tokenizer.end_ids = frozenset(i for i in ids if i >= 0)
    return tokenizer


def check_vocabulary(tokenizer: Tokenizer, model: ModelSettings, path: Path) -> None:
    """A ValueError unless every id of the tokenizer is the same string in the model's
    vocabulary (the model may have more ids: a padded output layer). Models without a
    vocabulary file are not checked."""
    vocabulary = model_vocabulary(Path(model.path))
    if vocabulary is None:
        return
    where = f"model {model.name!r} ({model.path})"
    if tokenizer.vocab_size > len(vocabulary):
        raise ValueError(
            f"{where}: the tokenizer {path} has {tokenizer.vocab_size} ids but the model's "
            f"vocabulary only {len(vocabulary)}: they do not belong together"
        )
    pieces = tokenizer.to_pieces(list(range(tokenizer.vocab_size)))
    for index, (piece, expected) in enumerate(zip(pieces, vocabulary, strict=False)):
        if piece != expected and piece:
            raise ValueError(
                f"{where}: id {index} is {piece!r} in the tokenizer {path} but {expected!r} in "
                "the model's vocabulary: they do not belong together"
            )


def model_vocabulary(directory: Path) -> list[str] | None:
    """The strings of the model's ids, from CTranslate2's vocabulary file; None without one."""
    json_file, text_file = (directory / name for name in VOCABULARY_FILES)
    try:
        if json_file.is_file():
            return [str(item) for item in json.loads(json_file.read_text(encoding="utf-8"))]
        if text_file.is_file():
            return text_file.read_text(encoding="utf-8").split("\n")[:-1]
    except (OSError, ValueError) as exc:
        raise ValueError(f"{directory}: the model's vocabulary is not readable: {exc}") from exc
    return None
