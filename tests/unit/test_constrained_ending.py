"""Where the grammar may end and the model writes past it, the answer ends: a model that ends
its line after a forced call is not steered into the next one (SmolLM2 repeated the same call
until ``max_tokens`` that way: ``tests/system/test_agent_sdk.py``).

``ConstrainedRun`` with a real llguidance matcher over the demo model's vocabulary; CTranslate2
is replaced by a scripted model that proposes the next token of the answer it wants and puts
the most logit, after its own token, on the opening ``<`` of another call."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from trickle.closure import Closer
from trickle.config.sections import ModelSettings
from trickle.grammar_matcher import MatcherCache
from trickle.tokenization import Tokenizer, load_tokenizer
from trickle.tool_grammar import ToolSchema, tool_call_grammar
from web.common.tools.calls import parse_answer
from web.common.tools.registry import make_parser
from worker.engine.constrained import ConstrainedRun, Sampling

PING = ToolSchema("ping", {"type": "object", "properties": {}}, "tools[0].parameters")
CALL = '<tool_call>\n{"name":"ping","arguments":{}}\n</tool_call>'
# What the scripted model means: one call, its line's end, then prose the grammar refuses.
WANTED = CALL + "\n\nThe answer is ready."


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> Tokenizer:
    return load_tokenizer(ModelSettings(name="demo", path=str(demo_model_dir)))


def scripted_model(
    tokenizer: Tokenizer, wanted: str, emitted: list[int]
) -> Callable[[list[str], int, int, Callable[[Any], bool]], None]:
    """A generate call: each step proposes the next token of ``wanted`` after what was emitted
    (its end token once the answer has left ``wanted``), with that token's logit highest, the
    call opening's ``<`` next and the end token's below both."""
    end = min(tokenizer.end_ids)
    opening = tokenizer.encode_text("<")[-1]
    wanted_ids = tokenizer.encode_text(wanted)

    def generate(_: list[str], max_new: int, __: int, callback: Callable[[Any], bool]) -> None:
        for _step in range(max_new):
            done = len(emitted)
            on_script = emitted == wanted_ids[:done] and done < len(wanted_ids)
            token = wanted_ids[done] if on_script else end
            logits = np.zeros(tokenizer.vocab_size)
            logits[end], logits[opening], logits[token] = 1.0, 5.0, 10.0
            step = SimpleNamespace(token_id=token, log_prob=0.0, is_last=False, logits=logits)
            if callback(step):
                return

    return generate


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_a_newline_after_a_forced_call_then_prose_ends_the_answer_with_one_call(
    tokenizer: Tokenizer, greedy: bool
) -> None:
    grammar = tool_call_grammar([PING], "hermes", None)  # parallel calls allowed
    matcher = MatcherCache(tokenizer).matcher(grammar)
    sampling = Sampling(greedy, 1.0, 0, 1.0, 1.0, 0, np.random.default_rng(7))
    run = ConstrainedRun(
        matcher,
        Closer(tokenizer.token_bytes()),
        str,
        frozenset(tokenizer.end_ids),
        tokenizer.vocab_size,
        sampling,
    )
    emitted: list[int] = []
    last: list[bool] = []

    def sink(token: int, _: Any, is_last: bool) -> bool:
        emitted.append(token)
        last.append(is_last)
        return is_last

    run.run([], 120, scripted_model(tokenizer, WANTED, emitted), sink)
    assert emitted[-1] in tokenizer.end_ids and last[-1]
    text = tokenizer.decode(emitted[:-1])
    assert text == CALL + "\n"
    answer = parse_answer(make_parser("hermes", None), text)
    assert [call.name for call in answer.calls] == ["ping"] and answer.content == ""
