"""A batch's output, held against its key's file storage before its lines' jobs are sent.

A batch's output file is written once every line has finished and is never refused then: the
requests ran. Counted only once written, one batch could overrun ``files.max_bytes_per_key`` by
its whole output (a line with ``n`` 8, ``top_logprobs`` 20 and 2,048 tokens answers tens of
MiB). So each line's output is held before its jobs are sent (``line_bound``), under one holder
per batch in the key's file quota, by the script uploads use (``trickle.store.held_quota``): two
batches, or a batch and an upload, never both take the last room. A line whose hold does not
fit waits (the reading pauses, as for ``max_queued_jobs``: ``web.batches.ingest``), unless no
room can come back (``web.batches.unread``); one whose hold could never fit fails on its own,
naming ``files.max_bytes_per_key``. Until a line is read it holds its unread error line
(held for every line when the batch is made, ``web.batches.quota.hold_unread_lines``), so a
reading that ends early never writes past the room.

Each settle pass replaces a finished line's hold by the bytes its output line takes (once per
line: ``keys.batch_output_settled``); the output files take the held bytes over as they are
written, and the batch's hold goes with its final stage. The hold lapses with the batch's
record (its TTL, as a batch's input hold does: ``web.batches.quota``), never before: the
workers run a batch's jobs whether or not its consumer is up, so its room stays held while
they may write.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from trickle import keys
from trickle.events import alternative_bytes, alternative_text, encode_text
from trickle.jobs import Job
from trickle.store.held_quota import HeldQuota, QuotaFull
from trickle.tokenization import Tokenizer
from web.batches.file_store import RECORD_BYTES
from web.batches.output import (
    FAILURE_CODE_CHARS,
    FAILURE_MESSAGE_CHARS,
    output_line,
    slices,
)
from web.batches.store import BatchItem, BatchRecord, BatchStore
from web.common.errors import HttpError
from web.services import Services

log = logging.getLogger(__name__)

# What a token may add besides its text: the structure a tool call makes of the text around it
# (a tool call's arguments are also quoted once more: its text counted twice).
TOKEN_STRUCTURE_BYTES = 32
# A logprobs entry's keys, its float (``repr``: 24 at most) and brackets; an alternative's.
LOGPROB_ENTRY_BYTES = 100
ALTERNATIVE_BYTES = 72
# A successful line's ids, usage, status and keys; a job's choice or output item besides its
# tokens (index, finish reason, message, job id).
LINE_BYTES = 768
JOB_BYTES = 512
# A failed line: ids and keys, its error's code and message (``output.FAILURE_MESSAGE_CHARS``
# and ``FAILURE_CODE_CHARS``, at most 6 bytes a character escaped).
FAILURE_LINE_BYTES = 256 + 6 * (FAILURE_MESSAGE_CHARS + 3 + FAILURE_CODE_CHARS)
# A Responses object repeats the request's fields: at most the body's own JSON, twice to spare.
BODY_ECHO_FACTOR = 2
FILE_NAMES = ("output", "error")


def output_quota(svc: Services, tenant_digest: str) -> HeldQuota:
    """The tenant's file storage (``files.max_bytes_per_key``) as a batch holds it: one holder
    per batch, never refused for the file count, but counted in it (one place of
    ``max_files_per_key`` while the batch runs, which its output files take over)."""
    return HeldQuota(
        svc.redis,
        keys.files_held(tenant_digest),
        keys.files_held_bytes(tenant_digest),
        svc.settings.files.max_bytes_per_key,
        sys.maxsize,
    )


OUTPUT_HOLDER_SUFFIX = "_output"


def holder_of(batch_id: str) -> str:
    return batch_id + OUTPUT_HOLDER_SUFFIX


def files_overhead(batch_id: str) -> int:
    """What the output and error files' records take besides their lines (``FileStore``)."""
    return sum(RECORD_BYTES + len(f"{batch_id}_{name}.jsonl") for name in FILE_NAMES)


@dataclass(frozen=True)
class TokenSizes:
    """The most any one vocabulary entry takes, as JSON, in each place an output line writes
    a token: its text, its text's "bytes" array, as an alternative, an alternative's array."""

    text: int
    text_bytes: int
    alternative: int
    alternative_bytes: int


def _json_size(text: str) -> int:
    return len(encode_text(text).encode())


@functools.cache
def token_sizes(tokenizer: Tokenizer) -> TokenSizes:
    """A token's text is its bytes decoded (a byte of a split character reads as U+FFFD, or
    joins its character: never longer than that), an alternative's as ``alternative_text``."""
    sizes = [0, 0, 0, 0]
    for spelled in tokenizer.token_bytes():
        text = spelled.decode("utf-8", "replace")
        alternative = alternative_text(spelled)
        found = (
            _json_size(text),
            len(json.dumps(list(text.encode()))),
            _json_size(alternative),
            len(json.dumps(alternative_bytes(alternative))),
        )
        sizes = [max(a, b) for a, b in zip(sizes, found, strict=True)]
    return TokenSizes(*sizes)


def line_bound(svc: Services, item: BatchItem, jobs: list[Job]) -> int:
    """An upper bound of the bytes a valid line's output line can take, success or failure.

    Derived from how ``web.batches.output`` renders a line (``web.openai.responses``'s shapes):
    each job answers at most ``max_tokens`` tokens, and no token's text, written as JSON, is
    longer than the longest vocabulary entry's (``token_sizes``: the text a job releases is
    its tokens' bytes decoded), twice that in a tool call's arguments (quoted once more), plus
    ``TOKEN_STRUCTURE_BYTES``. With logprobs, each token also has an entry (its text again, its
    "bytes" array, ``LOGPROB_ENTRY_BYTES``) and max(1, ``top_logprobs``) alternatives (each its
    text and array as an alternative, ``ALTERNATIVE_BYTES``); the legacy completions arrays
    are shorter. Around the answers: ``JOB_BYTES`` per job, ``LINE_BYTES`` and the custom_id
    per line, the request's fields a Responses object repeats (``BODY_ECHO_FACTOR`` times the
    body's JSON), and an echoed prompt (at most a token per byte of the body). So, per line:
    LINE + custom_id + 2 body + the sum over jobs of (JOB + max_tokens * per token), and never
    less than its error line (``failure_bound``).
    """
    body = len(json.dumps(item.body, ensure_ascii=False).encode())
    # Completions render logprobs arrays for any ``logprobs`` set, 0 included.
    wants_logprobs = item.body.get("logprobs") is not None or any(
        item.body.get(k) for k in ("top_logprobs", "include")
    )
    quoted_again = 2 if item.body.get("tools") else 1
    total = LINE_BYTES + _json_size(item.custom_id) + BODY_ECHO_FACTOR * body
    for job in jobs:
        sizes = token_sizes(svc.tokenizer(job.model))
        per_token = quoted_again * sizes.text + TOKEN_STRUCTURE_BYTES
        if wants_logprobs:
            per_token += LOGPROB_ENTRY_BYTES + sizes.text + sizes.text_bytes
            alternative = ALTERNATIVE_BYTES + sizes.alternative + sizes.alternative_bytes
            per_token += max(1, job.params.top_logprobs) * alternative
        total += JOB_BYTES + job.params.max_tokens * per_token
        if item.body.get("echo"):  # a prompt of at most a token per byte of the body
            total += body * sizes.text
    return max(total, failure_bound(item))


def failure_bound(item: BatchItem) -> int:
    """What a valid line's error line takes at most (its jobs failed, were cancelled or
    expired): ids, its custom_id and a message cut at ``MAX_ERROR_MESSAGE_CHARS``."""
    return FAILURE_LINE_BYTES + _json_size(item.custom_id)


def encoded_line(line: dict[str, Any]) -> bytes:
    """An output or error file's line, as written."""
    return (json.dumps(line, ensure_ascii=False) + "\n").encode()


def refused_line_bytes(svc: Services, batch: BatchRecord, index: int, item: BatchItem) -> int:
    """The exact bytes of a refused line's error line (``item.error`` set)."""
    return len(encoded_line(output_line(svc, batch, index, item, "failed", [])))


def check_projection(svc: Services, number: int, projected: int) -> None:
    """A line whose output could never fit the key's whole storage fails on its own."""
    limit = svc.settings.files.max_bytes_per_key
    if projected > limit:
        raise HttpError(
            400,
            "invalid_request_error",
            f"line {number}'s output may take up to {projected} bytes (max_tokens * n * the "
            f"bytes a token's text and logprobs take) and files.max_bytes_per_key is {limit}: "
            "the batch's output must fit the key's file storage; lower max_tokens, n or "
            "top_logprobs",
            f"line {number}.body.max_tokens",
            code="output_exceeds_file_storage",
        )


class OutputRoom:
    """One batch's hold of output room, taken line by line while a group is read: ``take``
    refuses what does not fit now (the line waits); ``release`` gives back what this group took
    unless ``keep`` says its lines were recorded."""

    def __init__(self, svc: Services, batch: BatchRecord):
        self.quota = output_quota(svc, batch.tenant_digest)
        self.holder = holder_of(batch.id)
        self._record = keys.batch(batch.id)
        self._lapses_at: float | None = None
        self._taken = 0

    def lapses_at(self) -> float:
        """When the batch's record expires (now, once it has): the hold never outlives it."""
        if self._lapses_at is None:
            left = int(self.quota.redis.pttl(self._record))
            self._lapses_at = time.time() + max(0, left) / 1000
        return self._lapses_at

    def take(self, adding: int) -> bool:
        """Holds ``adding`` more bytes; False when they do not fit. Nothing to add always fits,
        even on a key already past its storage (a refused line whose error line its unread
        hold covers must not wait for room it does not need)."""
        if adding <= 0:
            return True
        try:
            self.quota.hold(self.holder, adding, self.lapses_at())
        except QuotaFull:
            return False
        self._taken += adding
        return True

    def give_back(self, giving: int) -> None:
        """Lowers the hold (never below zero: ``held_quota`` clamps it)."""
        if giving > 0:
            self.quota.hold(self.holder, -giving, self.lapses_at(), enforce=False)
            self._taken = max(0, self._taken - giving)

    def keep(self) -> None:
        self._taken = 0

    def release(self) -> None:
        self.give_back(self._taken)
        self._taken = 0

    def drop(self, pipe: Any = None) -> None:
        """The batch holds nothing any more (its files are written, or it failed)."""
        self.quota.release(self.holder, pipe)


def settle_holds(svc: Services, store: BatchStore, batch: BatchRecord) -> Counter[str]:
    """Replaces each newly finished line's hold by the bytes its output line takes now (a
    failed line's by ``failure_bound``, since a cancel or expiry may still change its message);
    returns the lines' states, as ``output.counts``, and under ``given_back`` the bytes this
    pass gave back."""
    room = OutputRoom(svc, batch)
    tally: Counter[str] = Counter()
    settled = keys.batch_output_settled(batch.tenant_digest, batch.id)
    finished: list[tuple[int, BatchItem, str]] = []
    for index, item, state in slices(store, batch):
        tally[state] += 1
        # A refused line was held at its exact size when it was read.
        if state != "pending" and item.output_hold and item.error is None:
            finished.append((index, item, state))
        if len(finished) >= 100:
            tally["given_back"] += _settle_lines(svc, batch, room, settled, store, finished)
            finished = []
    if finished:
        tally["given_back"] += _settle_lines(svc, batch, room, settled, store, finished)
    return tally


def _settle_lines(
    svc: Services,
    batch: BatchRecord,
    room: OutputRoom,
    settled: str,
    store: BatchStore,
    finished: list[tuple[int, BatchItem, str]],
) -> int:
    """Settles the lines of ``finished`` not settled before (their bits read first, so a pass
    renders only the new ones; the script that sets their bits gives back their bytes in the
    same step, only for bits it set, so two passes at once never settle a line twice and one
    that dies midway leaves no line marked with its room still held); returns the bytes
    given back."""
    reads = svc.redis.pipeline(transaction=False)
    for index, _item, _state in finished:
        reads.getbit(settled, index)
    lines = [line for line, was in zip(finished, reads.execute(), strict=True) if not was]
    if not lines:
        return 0
    wanted = [job_id for _index, item, _state in lines for job_id in item.job_ids]
    found = dict(zip(wanted, svc.store.finished_many(wanted), strict=True))
    giving: dict[int, int] = {}
    for index, item, state in lines:
        jobs = [job for job_id in item.job_ids if (job := found.get(job_id)) is not None]
        line = output_line(svc, batch, index, item, state, jobs)
        actual = len(encoded_line(line)) if line["error"] is None else failure_bound(item)
        if actual > item.output_hold:
            log.warning(
                "batch %s line %d: output %d bytes, past its bound %d",
                batch.id, index, actual, item.output_hold,
            )  # fmt: skip
        giving[index] = max(0, item.output_hold - actual)
    return room.quota.give_back_once(room.holder, settled, giving, store.ttl_seconds)
