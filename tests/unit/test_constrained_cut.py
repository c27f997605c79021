"""A budget just above the shortest answer, and a model that fights the grammar: the answer is
cut and closed, and it parses and validates. A refused token's replacement used to drop the
way out its room check had found, so the next token's check searched again from a later state,
found nothing within the few tokens left, and the row wrote on unchecked until ``max_tokens``
cut it inside a string (the coverage bench's sampled answers on the demo model, 2 in 200).

``ConstrainedRun`` with a real llguidance matcher over the demo model's vocabulary; CTranslate2
is replaced by the proposals the demo model made in one such run, replayed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.schema_answers import assert_valid
from trickle.closure import Closer
from trickle.config.sections import ModelSettings
from trickle.grammar import json_schema_grammar
from trickle.grammar_matcher import MatcherCache
from trickle.tokenization import Tokenizer, load_tokenizer
from worker.engine.constrained import ConstrainedRun, Sampling

# JSONSchemaBench's Github_hard o82369, its two required fields: patterns of classes repeated
# with ``+``, where a walk that keeps writing one class never leaves.
PBJ = {
    "type": "object",
    "properties": {
        "_schema": {
            "type": "string",
            "pattern": "^pbj:([a-z0-9-]+):([a-z0-9\\.-]+):([a-z0-9-]+)?:([a-z0-9-]+)"
            ":([0-9]+-[0-9]+-[0-9]+)$",
        },
        "name": {"type": "string", "pattern": "^[a-zA-Z_]{1}[\\w-]*$"},
    },
    "required": ["_schema", "name"],
    "additionalProperties": False,
}
# The demo model's proposals in a run cut at 46 tokens that ended inside the first string:
# (proposed id, the id the refused step's logits favoured, or None where it was taken).
PROPOSALS = [
    (1877, 126), (1429, 1704), (1704, None), (480, None), (324, None), (271, 427), (391, 408),
    (408, None), (288, 408), (379, 408), (366, 385), (1091, 408), (324, None), (263, 408),
    (263, 910), (360, None), (427, None), (391, 408), (263, 324), (346, None), (271, 408),
    (259, 385), (519, 385), (366, 385), (288, 388), (322, 385), (274, None), (325, 346),
    (307, None), (1233, None), (322, 337), (923, None), (337, None),
]  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> Tokenizer:
    return load_tokenizer(ModelSettings(name="demo", path=str(demo_model_dir)))


def replayed_model(vocab_size: int) -> Callable[[list[str], int, int, Callable[[Any], bool]], None]:
    """Generate calls that propose ``PROPOSALS`` in order across restarts (then the end)."""
    proposals = iter(PROPOSALS)

    def generate(_: list[str], max_new: int, __: int, callback: Callable[[Any], bool]) -> None:
        for _step in range(max_new):
            token, favoured = next(proposals, (2, None))
            logits = np.zeros(vocab_size)
            if favoured is not None:
                logits[favoured] = 100.0
            step = SimpleNamespace(token_id=token, log_prob=0.0, is_last=False, logits=logits)
            if callback(step):
                return

    return generate


def test_an_answer_cut_near_its_shortest_length_after_refusals_parses_and_validates(
    tokenizer: Tokenizer,
) -> None:
    matchers = MatcherCache(tokenizer)
    grammar = json_schema_grammar(PBJ, "response_format")
    run = ConstrainedRun(
        matchers.matcher(grammar),
        Closer(tokenizer.token_bytes()),
        str,
        frozenset(tokenizer.end_ids),
        tokenizer.vocab_size,
        Sampling(True, 1.0, 1, 1.0, 1.0, 0, np.random.default_rng(0)),
    )
    emitted: list[int] = []

    def sink(token: int, _: Any, is_last: bool) -> bool:
        emitted.append(token)
        return is_last

    run.run([], 46, replayed_model(tokenizer.vocab_size), sink)
    assert_valid(PBJ, tokenizer.decode([t for t in emitted if t not in tokenizer.end_ids]))
