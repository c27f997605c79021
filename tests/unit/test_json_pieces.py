"""``web.openai.json_pieces``: a big answer written in bounded pieces reads as the same JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from web.openai import json_pieces as pieces
from web.openai.json_pieces import Lazy, json_pieces


def test_pieces_are_the_same_json_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pieces, "PIECE_CHARS", 1000)
    made: list[int] = []

    def entries() -> Iterator[dict[str, Any]]:
        for i in range(500):
            made.append(i)
            yield {"token": f't{i}\u00e9"', "logprob": -0.5, "top": [{"x": i}]}

    answer = {"id": "a", "choices": [{"index": 0, "logprobs": {"content": Lazy(entries())}}],
              "usage": {"n": 1}, "none": None, "empty": Lazy(iter(()))}  # fmt: skip
    written = list(json_pieces(answer))
    assert len(written) > 10 and max(len(piece) for piece in written) < 1000 + 200
    expected = {**answer, "empty": []}
    expected["choices"] = [{"index": 0, "logprobs": {"content": [
        {"token": f"t{i}\u00e9\"", "logprob": -0.5, "top": [{"x": i}]} for i in range(500)
    ]}}]  # fmt: skip
    assert json.loads("".join(written)) == expected


def test_entries_are_made_as_they_are_written() -> None:
    made: list[int] = []

    def entries() -> Iterator[int]:
        for i in range(3):
            made.append(i)
            yield i

    stream = json_pieces({"a": Lazy(entries())})
    assert made == []
    assert "".join(stream) == '{"a":[0,1,2]}' and made == [0, 1, 2]
