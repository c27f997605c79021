"""What the publisher keeps so that Redis losing its last writes never costs a stream its tail.

Redis acknowledges a write before its append-only file has it on disk, so a crash can bring it
back without its last second or two: a job's replay log shorter than the tokens its worker sent,
or a final state gone. The publisher's scripts notice the first (an append past the log's end, a
final state over a short log) and answer the log's length; the tokens to send again come from
here. A final state Redis acknowledged is kept a while longer, with its tokens, to be sent again
when the worker's heartbeat finds that Redis restarted.

Kept by reference (the items the engine thread built), one list append per job per flush: what
a flush that lands costs does not change.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from worker.publish_items import FinishItem, TokenItem

log = logging.getLogger(__name__)

# How long a stored final state is kept to send again after a Redis restart: longer than the
# writes an ``everysec`` crash can lose (about two seconds), a restart and a heartbeat.
KEEP_FINISHED_SECONDS = 10.0


class Finished(NamedTuple):
    """A final state Redis acknowledged, with the job's tokens, in case it loses them."""

    item: FinishItem
    sent: list[list[TokenItem]]
    at: float  # monotonic


class KeptTokens:
    """Every token sent per job until its final state is stored, then the final state too."""

    def __init__(self) -> None:
        self._sent: dict[str, list[list[TokenItem]]] = {}
        self._finished: dict[str, Finished] = {}  # oldest first
        self._rechecking: set[str] = set()

    def add(self, tokens: list[list[TokenItem]]) -> None:
        """One flush's tokens, a list per job, as they go to Redis."""
        sent = self._sent
        for job_tokens in tokens:
            job_id = job_tokens[0].event.job_id
            if job_id in sent:
                sent[job_id].append(job_tokens)
            else:
                sent[job_id] = [job_tokens]

    def count(self, job_id: str) -> int:
        """The log length a job's final state needs: one past the last token sent (0: none)."""
        sent = self._sent.get(job_id)
        return sent[-1][-1].event.index + 1 if sent else 0

    def drop(self, job_id: str) -> None:
        """The job is no longer this worker's (fenced out, released)."""
        self._sent.pop(job_id, None)

    def missing(self, job_id: str, length: int) -> list[TokenItem] | None:
        """The tokens a job's log lost, from ``length`` on; None when it lost some that this
        worker never sent (an earlier run's: it resumed after them), which it cannot restore."""
        sent = self._sent.get(job_id)
        tokens = [token for chunk in sent or () for token in chunk if token.event.index >= length]
        if not sent or not tokens or sent[0][0].event.index > length:
            log.error("job %s: its replay log lost tokens this worker cannot restore", job_id)
            self._sent.pop(job_id, None)
            return None
        log.warning(
            "job %s: the replay log lost tokens %d to %d (Redis lost writes); sending them again",
            job_id,
            length,
            tokens[-1].event.index,
        )
        return tokens

    def stored(self, item: FinishItem, stored: bool, now: float) -> None:
        """A final state's answer: if stored, kept until ``expire`` passes it."""
        job_id = item.job_id
        sent = self._sent.pop(job_id, [])
        again = job_id in self._rechecking
        self._rechecking.discard(job_id)
        if stored:
            if again:
                log.warning("job %s: its final state was lost with Redis; stored again", job_id)
            self._finished.pop(job_id, None)
            self._finished[job_id] = Finished(item, sent, now)
        elif not again:  # a recheck of a final state that survived: nothing to say
            log.warning("final state of %s not stored: this worker lost its lease", job_id)

    def expire(self, now: float) -> None:
        """Forget the final states stored more than ``KEEP_FINISHED_SECONDS`` ago."""
        finished = self._finished
        cutoff = now - KEEP_FINISHED_SECONDS
        while finished:
            job_id, entry = next(iter(finished.items()))
            if entry.at >= cutoff:
                return
            del finished[job_id]

    def finished_again(self) -> list[FinishItem]:
        """Redis restarted: the kept final states, to send again, their tokens ready to restore
        the log (a job running here again, claimed anew, is not one of them)."""
        again = []
        for job_id, entry in self._finished.items():
            if job_id in self._sent:
                continue
            self._sent[job_id] = entry.sent
            self._rechecking.add(job_id)
            again.append(entry.item)
        self._finished.clear()
        return again
