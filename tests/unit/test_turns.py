"""web.common.turns: long loops take turns, and garbage collection pauses only while a batch is
made."""

from __future__ import annotations

import gc
import time

import pytest

from web.common.turns import collection_paused, in_groups, in_turns


def test_in_turns_yields_every_item_and_a_turn_after_each_stretch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    turns: list[int] = []
    seen: list[int] = []
    monkeypatch.setattr(time, "sleep", lambda _seconds: turns.append(len(seen)))
    seen.extend(in_turns(range(120), every=50))
    assert seen == list(range(120))
    assert turns == [50, 100]


def test_in_groups_slices_with_a_turn_between(monkeypatch: pytest.MonkeyPatch) -> None:
    turns: list[int] = []
    monkeypatch.setattr(time, "sleep", lambda _seconds: turns.append(1))
    assert [list(group) for group in in_groups(list(range(7)), 3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert len(turns) == 2


def test_collection_resumes_when_the_last_overlapping_pause_ends() -> None:
    assert gc.isenabled()
    first = collection_paused()
    second = collection_paused()
    first.__enter__()
    second.__enter__()
    assert not gc.isenabled()
    first.__exit__(None, None, None)
    assert not gc.isenabled()  # the other request is still making its records
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_a_pause_someone_else_made_is_left_to_them() -> None:
    gc.disable()
    try:
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_an_error_inside_still_resumes_collection() -> None:
    with pytest.raises(RuntimeError), collection_paused():
        raise RuntimeError("a refused batch")
    assert gc.isenabled()
