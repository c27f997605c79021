"""``web.batches.file_store.lines_of``: a chunked file's lines and the offset just past each, from
any byte on; the offsets are what a resumed batch reading starts from."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from web.batches.file_store import lines_of

TEXT = b'{"a": 1}\n\n{"b": 22}\r\n{"c": "x\xe2\x80\xa8y"}\nlast'


def chunked(data: bytes, size: int) -> Iterator[bytes]:
    return (data[i : i + size] for i in range(0, len(data), size))


@pytest.mark.parametrize("size", [1, 2, 3, 7, 9, 64])
def test_lines_and_offsets_do_not_depend_on_the_chunks(size: int) -> None:
    found = list(lines_of(chunked(TEXT, size)))
    assert [line for _end, line in found] == TEXT.split(b"\n")
    assert [end for end, _line in found] == [9, 10, 21, 36, len(TEXT)]


@pytest.mark.parametrize("size", [1, 4, 64])
def test_reading_from_an_offset_gives_the_rest(size: int) -> None:
    every = list(lines_of(chunked(TEXT, size)))
    for index, (end, _line) in enumerate(every):
        assert list(lines_of(chunked(TEXT, size), end)) == every[index + 1 :]


def test_a_file_ending_in_a_newline_has_no_empty_last_line() -> None:
    assert list(lines_of(iter([b"a\nb\n"]))) == [(2, b"a"), (4, b"b")]
    assert list(lines_of(iter([b""]))) == []
