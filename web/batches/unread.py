"""Ending a batch's reading before its input is read: its unread lines fail, then it finalizes.

A ``validating`` batch would otherwise wait for good: its window can end while it waits for
room or for the key's queue (a batch past its window runs nothing more: the lines not read fail
``batch_expired``, the batch ends ``expired``), and its waiting for file storage can have no
end (its read lines all finished, their output held at what it takes, and no other batch of
the key holds room that its settling could give back: the lines not read fail naming
``files.max_bytes_per_key``, since only the client can delete files). Each unread line
becomes an error line (its ``custom_id`` when the line has one), counted against the key's
storage like every other output line, never refused (``web.batches.output_room``). Two
batches of a key that each wait while the other holds room both wait for their windows: the
other's settling might yet give some back.
"""

from __future__ import annotations

import json

from web.batches.file_store import line_groups
from web.batches.lines import failed_item
from web.batches.output_room import OutputRoom, files_overhead, refused_line_bytes
from web.batches.store import BatchRecord, BatchStore
from web.common.errors import HttpError
from web.services import Services

# Lines written to the batch's items per script call.
GROUP_LINES = 500


def window_ended_error() -> HttpError:
    return HttpError(
        408,
        "invalid_request_error",
        "the batch's completion window ended before this line was read",
        code="batch_expired",
    )


def storage_full_error(svc: Services, number: int) -> HttpError:
    limit = svc.settings.files.max_bytes_per_key
    return HttpError(
        429,
        "file_storage_full",
        f"the batch stopped at line {number}: its finished lines' output and this key's other "
        f"files fill files.max_bytes_per_key ({limit}), so no room for the rest of its output "
        "would come back; delete files (outputs included) and send the lines not run again",
        "files.max_bytes_per_key",
        code="file_storage_full",
    )


def fail_unread(
    svc: Services,
    store: BatchStore,
    batch: BatchRecord,
    start: tuple[int, int],
    error: HttpError,
) -> bool:
    """Records every line from byte ``start[0]`` of the input (``start[1]`` lines read before
    it) as failed with ``error``, its error line's bytes held (never refused). Returns False
    when another reading moved the offset first (that one goes on: nothing more is written)."""
    assert batch.input_file_id is not None
    room = OutputRoom(svc, batch)
    offset, number = start
    chunks = svc.files.chunks(batch.input_file_id)
    max_line = svc.settings.web.max_body_bytes
    for read_to, lines in line_groups(chunks, offset, max_line, GROUP_LINES):
        if read_to == offset:  # nothing left to read
            break
        group = [failed_item(_custom_id(raw), batch.endpoint, error) for _end, raw in lines]
        for index, item in enumerate(group, number):
            item.output_hold = refused_line_bytes(svc, batch, index, item)
        holding = sum(item.output_hold for item in group)
        holding += files_overhead(batch.id) if number == 0 and group else 0
        room.take_anyway(holding)
        if not store.append_group(batch.id, group, offset, read_to, number + len(group)):
            room.give_back(holding)
            return False
        offset, number = read_to, number + len(group)
    return True


def _custom_id(raw: bytes) -> str:
    """The line's ``custom_id`` when it reads as one (else none: its error line says null)."""
    try:
        found = json.loads(raw).get("custom_id")
    except (ValueError, AttributeError):
        return ""
    return found if isinstance(found, str) else ""
