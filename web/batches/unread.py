"""Ending a batch's reading before its input is read: its unread lines fail, then it finalizes.

A ``validating`` batch would otherwise wait for good: its window can end while it waits for
room or for the key's queue (a batch past its window runs nothing more: the lines not read fail
``batch_expired``, the batch ends ``expired``), and its waiting for file storage can have no
end (its read lines all finished, their output held at what it takes, and no other batch of
the key holds room that its settling could give back: the lines not read fail naming
``files.max_bytes_per_key``, since only the client can delete files). Each unread line
becomes an error line (its ``custom_id`` when the line has one), and its room is already held:
a batch holds, from its creation, every line's unread error line (``unread_line_bound``: the
longer of the two errors, at the largest line number, with the line's own ``custom_id``,
counted in one pass over the input, ``count_input``), and a line read turns that into its
output's hold (``web.batches.ingest``). So the end of a reading only spends what it holds and
gives back the rest: stored plus held never passes ``files.max_bytes_per_key``, whatever the
room when the reading ends. Two batches of a key that each wait while the other holds room
both wait for their windows: the other's settling might yet give some back.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from trickle.events import encode_text
from web.batches.file_store import line_groups, lines_of
from web.batches.lines import failed_item
from web.batches.output import output_line
from web.batches.output_room import OutputRoom, encoded_line, refused_line_bytes
from web.batches.store import BatchRecord, BatchStore
from web.common.errors import HttpError
from web.common.turns import in_turns
from web.services import Services

log = logging.getLogger(__name__)

# Lines written to the batch's items per script call.
GROUP_LINES = 500
# What a JSON null takes where an unread line's error line writes its custom_id.
NULL_BYTES = len("null")
# Lines a new batch's count reads (blank ones too) between turns of the web process's loop.
COUNT_YIELD_LINES = 100


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


def unread_line_base(svc: Services, batch_id: str) -> int:
    """What an unread line's error line takes at most without its ``custom_id`` (written as
    null): the longer of the two errors that end a reading, at the largest index and line
    number a batch can have (``limits.max_batch_requests``)."""
    last = svc.settings.limits.max_batch_requests
    batch = BatchRecord(batch_id, "", 0.0, "", last)
    errors = (storage_full_error(svc, last), window_ended_error())
    return max(
        len(encoded_line(output_line(svc, batch, last, failed_item("", "", e), "failed", [])))
        for e in errors
    )


def unread_line_bound(base: int, custom_id: str) -> int:
    """An unread line's error line at most, from ``unread_line_base`` and its ``custom_id``
    (``unread_custom_id``): what the batch holds for the line until it is read."""
    if not custom_id:
        return base
    return base - NULL_BYTES + len(encode_text(custom_id).encode())


@dataclass(frozen=True)
class InputCount:
    """A new batch's input as its holds see it: its lines, and what their unread error
    lines take at most (``unread_line_bound`` summed)."""

    lines: int
    unread_bytes: int


def count_input(svc: Services, batch_id: str, lines: Iterable[bytes]) -> InputCount:
    """Counts the non-blank ``lines`` (as the reading splits and cuts them) and their unread
    error lines' bound, in one pass; yields to the event loop between groups of lines."""
    base = unread_line_base(svc, batch_id)
    count = total = 0
    for raw in in_turns(lines, COUNT_YIELD_LINES):  # a large input never holds other requests
        if raw.strip():
            count += 1
            total += unread_line_bound(base, unread_custom_id(raw))
    return InputCount(count, total)


def count_file(svc: Services, batch_id: str, file_id: str) -> InputCount:
    """``count_input`` over a stored input file, read a chunk at a time."""
    chunks = svc.files.chunks(file_id)
    lines = lines_of(chunks, max_line=svc.settings.web.max_body_bytes)
    return count_input(svc, batch_id, (line for _end, line in lines))


def fail_unread(
    svc: Services,
    store: BatchStore,
    batch: BatchRecord,
    start: tuple[int, int],
    error: HttpError,
) -> bool:
    """Records every line from byte ``start[0]`` of the input (``start[1]`` lines read before
    it) as failed with ``error``; each error line's room was held at the batch's creation
    (``unread_line_bound``), and what it does not take is given back. Returns False when
    another reading moved the offset first (that one goes on: nothing more is written)."""
    assert batch.input_file_id is not None
    room = OutputRoom(svc, batch)
    base = unread_line_base(svc, batch.id)
    offset, number = start
    chunks = svc.files.chunks(batch.input_file_id)
    max_line = svc.settings.web.max_body_bytes
    for read_to, lines in line_groups(chunks, offset, max_line, GROUP_LINES):
        if read_to == offset:  # nothing left to read
            break
        custom_ids = [unread_custom_id(raw) for _end, raw in lines]
        group = [failed_item(custom_id, batch.endpoint, error) for custom_id in custom_ids]
        for index, item in enumerate(group, number):
            item.output_hold = refused_line_bytes(svc, batch, index, item)
        held = sum(unread_line_bound(base, custom_id) for custom_id in custom_ids)
        written = sum(item.output_hold for item in group)
        if written > held:  # never, while the bound is one: the batch then passes its room
            log.warning("batch %s: unread lines take %d bytes, held %d", batch.id, written, held)
        if not store.append_group(batch.id, group, offset, read_to, number + len(group)):
            return False
        room.give_back(held - written)
        offset, number = read_to, number + len(group)
    return True


def unread_custom_id(raw: bytes) -> str:
    """The line's ``custom_id`` when it reads as one (else none: its error line says null);
    one that UTF-8 cannot write (a lone surrogate) is none too."""
    try:
        found = json.loads(raw).get("custom_id")
        if isinstance(found, str):
            found.encode()
            return found
    except (ValueError, RecursionError, AttributeError):  # UnicodeError is a ValueError
        pass
    return ""
