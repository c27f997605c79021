"""Stop-sequence holding: text that may become a stop string is never released early."""

from __future__ import annotations

import pytest

from worker.engine.stops import StopCheck, StopMatcher


def feed_all(matcher: StopMatcher, chunks: list[str]) -> tuple[str, bool]:
    released = ""
    for chunk in chunks:
        check = matcher.feed(chunk)
        released += check.released
        if check.stopped:
            return released, True
    return released + matcher.flush(), False


def test_stop_spanning_chunks_is_cut_and_never_released() -> None:
    matcher = StopMatcher(["END"])
    released = [matcher.feed(chunk) for chunk in ["The e", "xample E", "N", "D tail"]]
    assert [check.released for check in released] == ["The e", "xample ", "", ""]
    assert [check.stopped for check in released] == [False, False, False, True]


def test_partial_match_is_released_when_it_diverges() -> None:
    matcher = StopMatcher(["STOP"])
    first = matcher.feed("ab ST")
    assert first.released == "ab " and not first.stopped
    second = matcher.feed("ART")
    assert second.released == "START" and not second.stopped


def test_earliest_of_several_stops_wins() -> None:
    assert feed_all(StopMatcher(["cd", "b"]), ["abcd"]) == ("a", True)


def test_held_text_is_flushed_at_the_end() -> None:
    assert feed_all(StopMatcher(["xyz"]), ["hello x", "y"]) == ("hello xy", False)


def test_no_stops_passes_through() -> None:
    assert feed_all(StopMatcher([]), ["a", "b"]) == ("ab", False)


@pytest.mark.parametrize("order", [["zzz", "END"], ["END", "zzz"], ["q", "zzz", "END"]])
def test_hold_back_covers_every_stop_string_not_just_the_first(order: list[str]) -> None:
    matcher = StopMatcher(order)
    first = matcher.feed("The tail EN")  # could still become "END": held, whatever its place
    assert first.released == "The tail " and not first.stopped
    second = matcher.feed("D and more")
    assert second.released == "" and second.stopped


def test_hold_back_is_the_longest_prefix_over_all_stops() -> None:
    # "ab" could start "abc"; "b" alone could start "bz": the longer hold wins.
    matcher = StopMatcher(["bz", "abc"])
    assert matcher.feed("xab").released == "x"
    assert matcher.feed("d").released == "abd"
    # Exactly one character short of a stop is held whole; a full stop is cut off.
    matcher = StopMatcher(["1234"])
    assert matcher.feed("0123").released == "0"
    assert matcher.feed("4").stopped


def test_held_text_is_never_released_twice_nor_lost() -> None:
    matcher = StopMatcher(["<|end|>", "\n\n"])
    chunks = ["Hello <", "|en", "dx", " and\n", "more\n", "\n tail"]
    released, stopped = feed_all(matcher, chunks)
    assert (released, stopped) == ("Hello <|endx and\nmore", True)


def test_checks_are_exact_values() -> None:
    assert StopMatcher([]).feed("ab") == StopCheck("ab", False)
    assert StopMatcher([""]).feed("ab") == StopCheck("ab", False)  # empty stops are ignored
    matcher = StopMatcher(["xyz"])
    assert matcher.feed("ab") == StopCheck("ab", False)
    assert matcher.feed("x") == StopCheck("", False)
    assert matcher.feed("yz!") == StopCheck("", True, "xyz")


def test_a_stop_at_the_very_start_releases_nothing() -> None:
    assert StopMatcher(["ab"]).feed("abc") == StopCheck("", True, "ab")
    assert StopMatcher(["b", "a"]).feed("ab") == StopCheck("", True, "a")


def test_after_a_match_or_a_flush_nothing_stays_held() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.feed("E") == StopCheck("", False)
    assert matcher.flush() == "E"
    assert matcher.flush() == ""
    assert matcher.feed("xEN") == StopCheck("x", False)
    assert matcher.feed("D") == StopCheck("", True, "END")
    assert matcher.flush() == ""
    assert matcher.feed("abc") == StopCheck("abc", False)


def test_a_buffer_shorter_than_the_stop_is_held_whole() -> None:
    matcher = StopMatcher(["abcdef"])
    assert matcher.feed("ab") == StopCheck("", False)
    assert matcher.feed("c") == StopCheck("", False)
    assert matcher.feed("x") == StopCheck("abcx", False)


def test_the_first_occurrence_of_a_stop_cuts_the_text() -> None:
    assert StopMatcher(["b"]).feed("abab") == StopCheck("a", True, "b")
    assert StopMatcher(["zz", "b"]).feed("abzzb") == StopCheck("a", True, "b")


def test_the_matched_stop_is_named_and_the_earliest_wins() -> None:
    matcher = StopMatcher(["LATE", "END", "EN"])
    assert matcher.feed("a LA") == StopCheck("a ", False)
    assert matcher.feed("TE and END") == StopCheck("", True, "LATE")
    # At one position the first listed wins ("END" before "EN").
    assert StopMatcher(["END", "EN"]).feed("xEND") == StopCheck("x", True, "END")
    assert StopMatcher(["EN", "END"]).feed("xEND") == StopCheck("x", True, "EN")
