"""Token events: what a worker publishes per flush and what the replay log stores.

Each job has its own channel (``keys.job_events_channel``); a message on it carries that job's
tokens from one publisher flush, its done signal, or the news that it changed status without a
token (claimed, requeued: readers then re-read its state and tell their clients, ``status``
events). The job id is the channel's, so a message names no job, and a web process only ever
receives messages of jobs its readers follow.

A token's text is JSON-encoded once, in the worker, as a JSON string literal; the web tier keeps
that literal and writes it into SSE events, WebSocket frames and OpenAI chunks as it is, never
parsing and re-encoding it. A token message is therefore lines, not a JSON document:

    t<first index> <count>
    <literal of token first>
    ...
    <logprobs, comma-separated>
    [<the alternatives of each token: a JSON array of [[text, logprob], ...] or null>]

A JSON string literal never holds a raw newline (``encode_basestring`` escapes every control
character), so splitting on ``\\n`` is exact. The logprob line is parsed only by a reader whose
client asked for logprobs; the alternatives line is there only for a job that asked for them
(``top_logprobs``).

A job that its worker finishes (``store.scripts.FINISH``) ends with a record message instead of
the bare done message: ``D`` and a JSON array, the length of the job's replay log then the
values of ``trickle.jobs.READ_FIELDS`` (``false`` for a field not set), read inside the script
that stored them. It is what a reader would read next, so readers that hold every token up to
that length end without reading the job again. Other endings (a cancel, an expiry, a recovery)
send the bare ``d`` and readers read the job.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from trickle.jobs import READ_FIELDS, FinishReason, Job, hash_fields

# The C encoder of one string with non-ASCII kept: exactly what ``json.dumps(text,
# ensure_ascii=False)`` writes, without building a JSONEncoder per call.
encode_text: Any = json.encoder.encode_basestring


# A token's most likely alternatives at its step: (piece text, log-probability), best first.
Alternatives = tuple[tuple[str, float], ...]

# An alternative whose bytes are no UTF-8 text of their own (one byte of a character split
# across tokens) is written as OpenAI writes it: "bytes:" and each byte as \xHH.
BYTES_PREFIX = "bytes:"
_HEX_BYTES = re.compile(r"(?:\\x[0-9a-f]{2})+")


def alternative_text(spelled: bytes) -> str:
    """A vocabulary entry's bytes as an alternative's text."""
    try:
        return spelled.decode("utf-8")
    except UnicodeDecodeError:
        return BYTES_PREFIX + "".join(f"\\x{byte:02x}" for byte in spelled)


def alternative_bytes(text: str) -> list[int]:
    """An alternative's bytes, the ones ``alternative_text`` wrote out included."""
    hexes = text[len(BYTES_PREFIX) :]
    if text.startswith(BYTES_PREFIX) and _HEX_BYTES.fullmatch(hexes):
        return list(bytes.fromhex(hexes.replace("\\x", "")))
    return list(text.encode("utf-8"))


class TokenEvent:
    """Token ``index`` (0-based) of a job and the text it released (may be empty while held).

    ``logprob`` is the sampled token's log-probability under the model (None if unknown);
    ``top`` its step's most likely tokens, for a job that asked (``top_logprobs``). ``end``
    marks the token that ended the job (why, and the stop string that did, if one): a worker
    that died after logging it but before storing the result leaves a log that says the job
    is complete, and the next claim finalizes it instead of running it again
    (``store.scripts.CLAIM``). A plain slotted class: one is built per token on the engine
    thread, and a frozen dataclass costs several times more to build. Treated as immutable.
    """

    __slots__ = ("end", "index", "job_id", "logprob", "stop_sequence", "text", "top")

    def __init__(
        self,
        job_id: str,
        index: int,
        text: str,
        logprob: float | None = None,
        top: Alternatives | None = None,
        end: FinishReason | None = None,
        stop_sequence: str = "",
    ):
        self.job_id = job_id
        self.index = index
        self.text = text
        self.logprob = logprob
        self.top = top
        self.end = end
        self.stop_sequence = stop_sequence

    def _fields(
        self,
    ) -> tuple[str, int, str, float | None, Alternatives | None, FinishReason | None, str]:
        return (
            self.job_id,
            self.index,
            self.text,
            self.logprob,
            self.top,
            self.end,
            self.stop_sequence,
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TokenEvent) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            "TokenEvent(job_id={!r}, index={!r}, text={!r}, logprob={!r}, top={!r}, end={!r}, "
            "stop_sequence={!r})"
        ).format(*self._fields())

    def to_log_entry(self) -> str:
        """The replay-log form; the job id is implied by the list's key."""
        return self.log_entry(encode_text(self.text))

    def log_entry(self, literal: str) -> str:
        """The replay-log form from the text's literal (the publisher encodes it once).
        Exactly ``json.dumps`` of ``{"index", "text", "logprob"}``, and ``"top"``, ``"end"``
        and ``"stop_sequence"`` when set."""
        entry = f'{{"index": {self.index}, "text": {literal}, "logprob": {_number(self.logprob)}'
        if self.top is not None:
            entry += f', "top": {alternatives_literal(self.top)}'
        if self.end is not None:
            entry += f', "end": "{self.end.value}"'
            if self.stop_sequence:
                entry += f', "stop_sequence": {encode_text(self.stop_sequence)}'
        return entry + "}"

    @classmethod
    def from_log_entry(cls, job_id: str, raw: str | bytes) -> TokenEvent:
        data = json.loads(raw)
        logprob = _logprob(data.get("logprob"))
        end = data.get("end")
        return cls(
            job_id,
            int(data["index"]),
            str(data["text"]),
            logprob,
            _top(data.get("top")),
            None if end is None else FinishReason(end),
            str(data.get("stop_sequence", "")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "text": self.text}


class TokenRun:
    """Consecutive tokens of one job, ``first`` onwards, as the JSON literals of their texts.

    What the web tier carries from the channel to the client: a message's tokens stay one run,
    and the runs a reader takes in one wake-up are joined into one, so it writes once.
    """

    __slots__ = ("_logprobs", "_raw_logprobs", "_raw_tops", "_tops", "first", "literals")

    def __init__(
        self,
        first: int,
        literals: Sequence[str],
        logprobs: Sequence[float | None] | None = None,
        raw_logprobs: str = "",
        tops: Sequence[Alternatives | None] | None = None,
        raw_tops: str = "",
    ):
        self.first = first
        self.literals = literals
        self._logprobs = logprobs
        self._raw_logprobs = raw_logprobs  # parsed on first use (few clients ask)
        self._tops = tops
        self._raw_tops = raw_tops

    def __len__(self) -> int:
        return len(self.literals)

    def __repr__(self) -> str:
        return f"TokenRun({self.first}, {list(self.literals)!r})"

    def __eq__(self, other: object) -> bool:
        """The same tokens (logprobs aside: a run read live parses them only on demand)."""
        if not isinstance(other, TokenRun):
            return NotImplemented
        return self.first == other.first and list(self.literals) == list(other.literals)

    __hash__ = None  # type: ignore[assignment]

    @property
    def indexes(self) -> range:
        return range(self.first, self.end)

    @property
    def end(self) -> int:
        """The index after the last token."""
        return self.first + len(self.literals)

    @property
    def logprobs(self) -> Sequence[float | None]:
        if self._logprobs is None:
            raw = self._raw_logprobs
            self._logprobs = (
                [_logprob(json.loads(v)) for v in raw.split(",")]
                if raw
                else [None] * len(self.literals)
            )
        return self._logprobs

    @property
    def tops(self) -> Sequence[Alternatives | None]:
        """Each token's alternatives (None for a job that did not ask)."""
        if self._tops is None:
            raw = self._raw_tops
            self._tops = (
                [_top(entry) for entry in json.loads(raw)] if raw else [None] * len(self.literals)
            )
        return self._tops

    def _has_tops(self) -> bool:
        return bool(self._tops or self._raw_tops)

    def text_literal(self) -> str:
        """The literal of all the tokens' text together (joined without decoding any)."""
        if len(self.literals) == 1:
            return self.literals[0]
        return '"' + "".join(literal[1:-1] for literal in self.literals) + '"'

    @property
    def text(self) -> str:
        return str(json.loads(self.text_literal()))

    def starting_at(self, index: int) -> TokenRun:
        """The tokens from ``index`` on (``index`` within the run)."""
        skip = index - self.first
        if skip <= 0:
            return self
        logprobs = self.logprobs[skip:] if self._logprobs or self._raw_logprobs else None
        tops = self.tops[skip:] if self._has_tops() else None
        return TokenRun(index, self.literals[skip:], logprobs, tops=tops)

    def events(self, job_id: str) -> Iterator[TokenEvent]:
        """One event per token, texts decoded: for clients that want per-token detail."""
        rows = zip(self.literals, self.logprobs, self.tops, strict=True)
        for offset, (literal, logprob, top) in enumerate(rows):
            yield TokenEvent(job_id, self.first + offset, json.loads(literal), logprob, top)

    @classmethod
    def from_events(cls, events: Sequence[TokenEvent]) -> TokenRun:
        tops = [event.top for event in events]
        return cls(
            events[0].index,
            [encode_text(event.text) for event in events],
            [event.logprob for event in events],
            tops=tops if any(top is not None for top in tops) else None,
        )

    @classmethod
    def joined(cls, runs: Sequence[TokenRun]) -> TokenRun:
        """Consecutive runs as one."""
        if len(runs) == 1:
            return runs[0]
        literals = [literal for run in runs for literal in run.literals]
        tops = (
            [top for run in runs for top in run.tops]
            if any(run._has_tops() for run in runs)
            else None
        )
        if any(run._logprobs or run._raw_logprobs for run in runs):
            logprobs = [lp for run in runs for lp in run.logprobs]
            return cls(runs[0].first, literals, logprobs, tops=tops)
        return cls(runs[0].first, literals, tops=tops)


# The whole message a job's done channel (and, last, its events channel) carries.
DONE_MESSAGE = "d"
# The first character of a done message that carries the finished job's record.
RECORD_MESSAGE = "D"
# A job requeued (on its events channel only: a waiter needs the end alone): readers read it.
STATUS_MESSAGE = "s"
# A job claimed: it runs now, nothing else changed that a reader shows (no read needed).
CLAIMED_MESSAGE = "r"


def token_message(
    first: int,
    literals: Sequence[str],
    logprobs: Sequence[float | None],
    tops: Sequence[Alternatives | None] = (),
) -> str:
    """One flush of a job's tokens as its channel message (``tops``: only a job that asked)."""
    header = f"t{first} {len(literals)}\n"
    message = header + "\n".join(literals) + "\n" + ",".join(map(_number, logprobs))
    if not any(top is not None for top in tops):
        return message
    listed = ", ".join("null" if top is None else alternatives_literal(top) for top in tops)
    return f"{message}\n[{listed}]"


class FinalRecord(NamedTuple):
    """A finished job as the script that finished it stored it, and the length of its log."""

    job: Job
    logged: int

    @classmethod
    def decode(cls, payload: str) -> FinalRecord | None:
        """From a record message's JSON; None if it names no finished job or cannot be read
        (then readers read the job: a bad record must not stop the listener that decodes it)."""
        try:
            logged, *values = json.loads(payload)
            named = [None if value is False else value for value in values]
            fields = hash_fields(READ_FIELDS, named)
            job = Job.from_hash(fields) if "id" in fields else None
            if job is None or not job.status.is_terminal:
                return None
            return cls(job, int(logged))
        except (ValueError, TypeError, KeyError):
            return None


class JobMessage(NamedTuple):
    """One message on a job's channel, decoded: some of its tokens, the news that it finished
    (with its final record, when its worker finished it), or that its status changed (claimed,
    requeued)."""

    tokens: TokenRun | None = None
    done: bool = False
    status_changed: bool = False
    record: FinalRecord | None = None
    claimed: bool = False

    @classmethod
    def decode(cls, raw: str) -> JobMessage:
        kind = raw[:1]
        if kind == "t":
            lines = raw.split("\n")
            first, count = lines[0][1:].split(" ")
            end = 1 + int(count)
            tops = lines[end + 1] if len(lines) > end + 1 else ""
            return cls(TokenRun(int(first), lines[1:end], raw_logprobs=lines[end], raw_tops=tops))
        if kind == RECORD_MESSAGE:
            return cls(done=True, record=FinalRecord.decode(raw[1:]))
        if kind == CLAIMED_MESSAGE:
            return cls(claimed=True)
        return cls(done=kind == DONE_MESSAGE, status_changed=kind == STATUS_MESSAGE)


def _number(value: float | None) -> str:
    if value is None:
        return "null"
    return float.__repr__(value) if math.isfinite(value) else json.dumps(value)


def _logprob(value: Any) -> float | None:
    return None if value is None else float(value)


def alternatives_literal(top: Alternatives) -> str:
    """``[[text, logprob], ...]`` as JSON."""
    return json.dumps([[text, logprob] for text, logprob in top], ensure_ascii=False)


def _top(value: Any) -> Alternatives | None:
    if value is None:
        return None
    return tuple((str(text), float(logprob)) for text, logprob in value)
