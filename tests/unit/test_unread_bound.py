"""The room a batch holds for each line's unread error line from its creation
(``web.batches.unread``): never less than the error line a reading that ends early writes, at
most a few digits more, and never more than the failure bound a read line holds instead, so
a line's hold only grows as it is read."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from trickle.config.settings import Settings
from web.batches.lines import failed_item
from web.batches.output import output_line
from web.batches.output_room import encoded_line, failure_bound
from web.batches.store import BatchItem, BatchRecord, new_batch_id
from web.batches.unread import (
    count_input,
    storage_full_error,
    unread_custom_id,
    unread_line_base,
    unread_line_bound,
    window_ended_error,
)

CUSTOM_IDS = ["", "a", "request-1", 'quo"te\\back', "é😀\u2028", "\x01\n\t", "x" * 5000]


@pytest.fixture
def svc(settings: Settings) -> Any:
    return SimpleNamespace(settings=settings)


@pytest.mark.parametrize("custom_id", CUSTOM_IDS)
def test_an_unread_lines_bound_holds_its_error_line_at_any_line_number(
    svc: Any, custom_id: str
) -> None:
    batch = BatchRecord(new_batch_id(), "", 0.0, "/v1/chat/completions", 0)
    bound = unread_line_bound(unread_line_base(svc, batch.id), custom_id)
    last = svc.settings.limits.max_batch_requests
    written = []
    for index in (0, 9, 99, last - 1):
        for error in (storage_full_error(svc, index + 1), window_ended_error()):
            item = failed_item(custom_id, batch.endpoint, error)
            written.append(len(encoded_line(output_line(svc, batch, index, item, "failed", []))))
    assert max(written) <= bound
    assert bound - max(written) <= 8  # loose by the digits of the largest line number only


@pytest.mark.parametrize("custom_id", CUSTOM_IDS)
def test_an_unread_lines_bound_is_within_what_a_read_line_holds(svc: Any, custom_id: str) -> None:
    """A read line holds at least ``failure_bound``: turning its unread hold into its output
    hold only ever takes more room, never gives back room another holder then takes."""
    base = unread_line_base(svc, new_batch_id())
    item = BatchItem(custom_id=custom_id, url="/v1/chat/completions", body={})
    assert unread_line_bound(base, custom_id) <= failure_bound(item)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"custom_id": "r1", "body": {}}', "r1"),
        (b'{"custom_id": "caf\\u00e9"}', "caf\u00e9"),
        (b'{"custom_id": 7}', ""),
        (b'{"body": {"custom_id": "inner"}}', ""),
        (b'["custom_id"]', ""),
        (b'{"custom_id": "cut', ""),  # a line past the body limit, cut
        (b"[" * 100_000, ""),  # nesting past Python's recursion
        (b'{"custom_id": "\\ud800"}', ""),  # a lone surrogate UTF-8 cannot write
        (b"\xff\xfe", ""),
    ],
)
def test_a_lines_custom_id_is_read_as_its_error_line_writes_it(raw: bytes, expected: str) -> None:
    assert unread_custom_id(raw) == expected


def test_an_inputs_count_skips_blank_lines_and_sums_their_bounds(svc: Any) -> None:
    batch_id = new_batch_id()
    lines = [json.dumps({"custom_id": f"r{i}"}).encode() for i in range(3)]
    counted = count_input(svc, batch_id, [lines[0], b"", b"  ", lines[1], b"not json", lines[2]])
    base = unread_line_base(svc, batch_id)
    assert counted.lines == 4
    assert counted.unread_bytes == 3 * unread_line_bound(base, "r0") + base
