"""Token events: what a worker publishes per decoding step and what the replay log stores.

Each job has its own channel (``keys.job_events_channel``); a message on it carries that job's
tokens from one publisher flush, its done signal, or the news that it changed status without a
token (claimed, requeued: readers then re-read its state and tell their clients, ``status``
events). The job id is the channel's, so a message names no job, and a web process only ever
receives messages of jobs its readers follow.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TokenEvent:
    """Token ``index`` (0-based) of a job and the text it released (may be empty while held).

    ``logprob`` is the sampled token's log-probability under the model (None if unknown).
    """

    job_id: str
    index: int
    text: str
    logprob: float | None = None

    def to_log_entry(self) -> str:
        """The replay-log form; the job id is implied by the list's key."""
        return self.encoded()[0]

    def encoded(self) -> tuple[str, str]:
        """The replay-log entry and the channel-message item, built from one encoding of the
        text (the publisher makes both for every token; ``json.dumps`` of the whole is slower).
        Exactly ``json.dumps`` of ``{"index", "text", "logprob"}`` and of the list."""
        text = json.dumps(self.text, ensure_ascii=False)
        logprob = _number(self.logprob)
        return (
            f'{{"index": {self.index}, "text": {text}, "logprob": {logprob}}}',
            f"[{self.index}, {text}, {logprob}]",
        )

    @classmethod
    def from_log_entry(cls, job_id: str, raw: str | bytes) -> TokenEvent:
        data = json.loads(raw)
        return cls(job_id, int(data["index"]), str(data["text"]), _logprob(data.get("logprob")))

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "text": self.text}


# The whole message a job's done channel (and, last, its events channel) carries.
DONE_MESSAGE = '{"d":1}'
# A job claimed or requeued (on its events channel only: a waiter needs the end alone).
STATUS_MESSAGE = '{"s":1}'


def token_fragment(events: Sequence[TokenEvent]) -> str:
    """One flush of a job's tokens as the inside of a message's token list."""
    return ",".join(event.encoded()[1] for event in events)


@dataclass(frozen=True)
class JobMessage:
    """One message on a job's channel: some of its tokens, the news that it finished, or that
    its status changed (claimed, requeued)."""

    tokens: tuple[TokenEvent, ...] = ()
    done: bool = False
    status_changed: bool = False

    def encode(self) -> str:
        if self.done:
            return DONE_MESSAGE
        if self.status_changed:
            return STATUS_MESSAGE
        return '{"t":[' + token_fragment(self.tokens) + "]}"

    @classmethod
    def decode(cls, job_id: str, raw: str | bytes) -> JobMessage:
        data = json.loads(raw)
        return cls(
            tokens=tuple(
                TokenEvent(job_id, int(index), str(text), _logprob(logprob))
                for index, text, logprob in data.get("t", ())
            ),
            done=bool(data.get("d")),
            status_changed=bool(data.get("s")),
        )


def _number(value: float | None) -> str:
    if value is None:
        return "null"
    return float.__repr__(value) if math.isfinite(value) else json.dumps(value)


def _logprob(value: Any) -> float | None:
    return None if value is None else float(value)
