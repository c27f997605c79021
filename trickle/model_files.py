"""What a model directory says about itself: Hugging Face's ``tokenizer_config.json`` and
``generation_config.json``, layered under the configuration's explicit keys.

A converted model carries its chat template, its start and end tokens and whether its tokenizer
adds the start token; many also end a turn with tokens besides the tokenizer's own end token
(``generation_config.json``'s ``eos_token_id``, an int or a list). Without these files a model
is served as before: the built-in template, ``<s>``/``</s>``, the tokenizer's own start-token
rule. Shared by the web tier (templates, prompt tokens) and the engine (end tokens), so both
read one answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from trickle.config.sampling import SamplingDefaults, resolve_sampling
from trickle.config.sections import ModelSettings
from trickle.config.settings import ConfigError

TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"


@dataclass(frozen=True)
class ModelProfile:
    """A model's chat template, special tokens and end tokens, explicit configuration first."""

    chat_template: str = ""
    bos_token: str = "<s>"
    eos_token: str = "</s>"
    # None: neither the configuration nor tokenizer_config.json says; SentencePiece then adds
    # the start token, a Hugging Face tokenizer as its own post-processor does.
    add_bos: bool | None = None
    # Ids besides the tokenizer's end token that end generation (generation_config.json, or
    # models.<name>.eos_token_ids); the engine adds the tokenizer's own.
    end_token_ids: tuple[int, ...] = ()
    # End tokens named by the files (tokenizer_config.json's eos_token), resolved to ids by the
    # tokenizer; the template default "</s>" is never one (it may be plain text elsewhere).
    end_token_names: tuple[str, ...] = ()
    # What requests that leave a sampling field out get (configuration, else the files).
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)


@lru_cache(maxsize=64)
def model_profile(model: ModelSettings) -> ModelProfile:
    """The model's profile: ``models.<name>`` keys when set, else the directory's files."""
    directory = Path(model.path)
    tokenizer = _read_json(directory / TOKENIZER_CONFIG)
    generation = _read_json(directory / GENERATION_CONFIG)
    add_bos = model.add_bos
    if add_bos is None and "add_bos_token" in tokenizer:
        add_bos = bool(tokenizer["add_bos_token"])
    end_ids = model.eos_token_ids or _token_ids(
        generation.get("eos_token_id"), directory / GENERATION_CONFIG
    )
    return ModelProfile(
        chat_template=model.chat_template or _chat_template(tokenizer.get("chat_template")),
        bos_token=_token_text(tokenizer.get("bos_token"), "<s>"),
        eos_token=_token_text(tokenizer.get("eos_token"), "</s>"),
        add_bos=add_bos,
        end_token_ids=end_ids,
        end_token_names=(_token_text(tokenizer["eos_token"], ""),)
        if "eos_token" in tokenizer
        else (),
        sampling=resolve_sampling(model.sampling, generation),
    )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return data


def _chat_template(value: Any) -> str:
    """A template string, or Hugging Face's list of named templates (the ``default`` one)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {item.get("name"): item.get("template") for item in value if isinstance(item, dict)}
        template = named.get("default")
        return template if isinstance(template, str) else ""
    return ""


def _token_text(value: Any, default: str) -> str:
    """A special token as a string or as an AddedToken object (``{"content": "<s>", ...}``)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else default


def _token_ids(value: Any, path: Path) -> tuple[int, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(item, int) and not isinstance(item, bool) for item in items):
        raise ConfigError(f"{path}: eos_token_id must be an int or a list of ints")
    return tuple(items)
