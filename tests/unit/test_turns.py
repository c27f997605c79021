"""web.common.turns: long loops take turns."""

from __future__ import annotations

import time

import pytest

from web.common.turns import in_turns


def test_in_turns_yields_every_item_and_a_turn_after_each_stretch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    turns: list[int] = []
    seen: list[int] = []
    monkeypatch.setattr(time, "sleep", lambda _seconds: turns.append(len(seen)))
    seen.extend(in_turns(range(120), every=50))
    assert seen == list(range(120))
    assert turns == [50, 100]
