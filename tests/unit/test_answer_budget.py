"""The budget check's rule over what the closing search and greedy walk found
(``web.common.answer_budget``): the lengths are given, the rule is pure logic."""

from __future__ import annotations

import pytest

from trickle.closure import AnswerLength
from trickle.params import GenerationParams
from web.common.answer_budget import AnswerBudget
from web.common.errors import HttpError


class KnownLength(AnswerBudget):
    """The check with the shortest answer's length given, not searched."""

    def __init__(self, length: AnswerLength):
        self._length = length

    def shortest(self, grammar: str) -> AnswerLength:
        return self._length


def check(length: AnswerLength, max_tokens: int) -> HttpError | None:
    try:
        KnownLength(length).check(GenerationParams(max_tokens=max_tokens, grammar="g"), "demo")
    except HttpError as exc:
        return exc
    return None


def test_a_budget_an_answer_found_fits_is_taken_and_one_below_it_names_max_tokens() -> None:
    assert check(AnswerLength(5, 5), 5) is None
    refused = check(AnswerLength(5, 5), 4)
    assert refused is not None and refused.param == "max_tokens"
    assert "is 5 tokens" in refused.message


def test_a_proven_floor_without_an_answer_takes_a_budget_past_it() -> None:
    assert check(AnswerLength(513, None), 600) is None
    refused = check(AnswerLength(513, None), 256)
    assert refused is not None and "at least 513" in refused.message


@pytest.mark.parametrize("max_tokens", [3, 256, 4096])
def test_a_grammar_no_answer_was_found_for_is_refused_whatever_the_budget(
    max_tokens: int,
) -> None:
    refused = check(AnswerLength(1, None), max_tokens)
    assert refused is not None and refused.status == 400
    assert "no whole answer" in refused.message and "cannot be enforced" in refused.message
