"""A model that mostly follows a JSON schema: the demo model's bigram recipe on a corpus of
schema-valid answers (compact JSON, as the grammars are), for the constrained-decoding bench.

Built offline from a seeded generator, under ``models/`` like the other bench models.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import sentencepiece as spm

from bench.harness.models import MODELS_DIR, TOKENIZER_FILE
from ops.model_builders.demo import (
    bigram_log_probs,
    build_demo_model,
    encode_corpus,
    save_bigram_model,
)
from trickle.config.settings import DEFAULT_MODEL_DIR

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
        "mood": {"enum": ["happy", "sad"]},
    },
    "required": ["name", "age", "tags", "mood"],
    "additionalProperties": False,
}
WORDS = [
    "ada",
    "bob",
    "carol",
    "dave",
    "erin",
    "frank",
    "grace",
    "heidi",
    "ivan",
    "judy",
    "socket",
    "module",
    "thread",
    "queue",
]
ANSWERS = 4000


def person(rng: random.Random) -> str:
    """One compact, schema-valid answer."""
    value = {
        "name": " ".join(rng.choice(WORDS).title() for _ in range(rng.randint(1, 3))),
        "age": rng.randint(0, 99),
        "tags": [rng.choice(WORDS) for _ in range(rng.randint(0, 4))],
        "mood": rng.choice(["happy", "sad"]),
    }
    return json.dumps(value, separators=(",", ":"))


def build_json_model(directory: Path = MODELS_DIR / "bench-json") -> Path:
    """Build (once) the schema-following bigram model; the demo tokenizer is reused."""
    if (directory / "model.bin").is_file():
        return directory
    demo = build_demo_model(DEFAULT_MODEL_DIR)
    sp = spm.SentencePieceProcessor(model_file=str(demo / TOKENIZER_FILE))
    rng = random.Random(42)
    table = bigram_log_probs(
        encode_corpus(sp, [person(rng) for _ in range(ANSWERS)]), sp.get_piece_size()
    )
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    staging = directory.with_name(directory.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    save_bigram_model(table, pieces, staging)
    shutil.copy(demo / TOKENIZER_FILE, staging / TOKENIZER_FILE)
    staging.rename(directory)
    return directory
