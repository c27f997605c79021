"""A worker's output: each flush's tokens (fenced per job, published on each job's channel)
and a job's final state, queued on the publisher's pipeline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from worker import keys
from worker.events import DONE_MESSAGE, TokenEvent, encode_text, token_message
from worker.job_records import JobResult, StepAppend, StepOutcome
from worker.store_base import StoreBase


class OutputWrites(StoreBase):
    """Token flushes and final states, fenced by the lease the worker holds."""

    def set_prompt_tokens(self, job_id: str, prompt_tokens: int) -> None:
        self.redis.hset(keys.job(job_id), "prompt_tokens", str(prompt_tokens))

    def queue_step(self, pipe: Any, appends: Sequence[StepAppend]) -> int:
        """Add one flush of tokens to ``pipe``, fenced per job, each job's tokens published on
        its own channel. One script call for the whole flush on a single Redis; one per shard
        on a cluster (a script stays on one slot). Returns the number of calls queued."""
        groups = _by_shard(appends) if self.cluster else [list(appends)]
        for group in groups:
            script_keys: list[str] = []
            args: list[Any] = [self.publish, len(group)]
            for append in group:
                script_keys += [
                    keys.job(append.job_id),
                    keys.job_tokens(append.job_id),
                    keys.job_lease(append.job_id),
                    keys.job_output(append.job_id),
                    keys.job_events_channel(append.job_id),
                ]
                first = "" if append.first_token_at is None else repr(append.first_token_at)
                events = append.events
                # Each text is JSON-encoded here once: the log entries and the channel message
                # are built from the same literals, and readers forward them as they are.
                literals = [encode_text(event.text) for event in events]
                args += [append.fence, first, events[0].index, len(events)]
                args += map(TokenEvent.log_entry, events, literals)
                args.append("".join(event.text for event in events))
                args.append(
                    token_message(events[0].index, literals, [event.logprob for event in events])
                )
            self.queue_script(pipe, "APPEND_STEP", script_keys, args)
        return len(groups)

    def step_outcome(self, appends: Sequence[StepAppend], *replies: Sequence[Any]) -> StepOutcome:
        """Read the reply of each of ``queue_step``'s calls (only exceptions come back)."""
        groups = _by_shard(appends) if self.cluster else [list(appends)]
        fenced_out: list[str] = []
        cancel_requested: list[str] = []
        for group, reply in zip(groups, replies, strict=True):
            for position in reply:
                append = group[abs(int(position)) - 1]
                (fenced_out if int(position) < 0 else cancel_requested).append(append.job_id)
        return StepOutcome(fenced_out=fenced_out, cancel_requested=cancel_requested)

    def queue_finish(self, pipe: Any, job_id: str, fence: str, result: JobResult) -> None:
        """Add a job's final state to ``pipe``; ignored unless this worker holds the lease."""
        args: list[Any] = [job_id, fence, self.result_ttl_seconds, self.publish, DONE_MESSAGE]
        for name, value in result.fields().items():
            args += [name, value]
        self.queue_script(
            pipe,
            "FINISH",
            [
                keys.job(job_id),
                keys.job_tokens(job_id),
                keys.job_lease(job_id),
                keys.running_jobs(keys.shard_of(job_id)),
                keys.job_output(job_id),
                keys.job_events_channel(job_id),
                keys.job_done_channel(job_id),
            ],
            args,
        )

    def finish(self, job_id: str, fence: str, result: JobResult) -> bool:
        """Store a final state outside the token path (failures before generation)."""
        (stored,) = self.execute(lambda pipe: self.queue_finish(pipe, job_id, fence, result))
        return bool(stored)


def _by_shard(appends: Sequence[StepAppend]) -> list[list[StepAppend]]:
    """A flush's appends grouped by shard, in a stable order (replies are matched by position)."""
    groups: dict[int, list[StepAppend]] = {}
    for append in appends:
        groups.setdefault(keys.shard_of(append.job_id), []).append(append)
    return list(groups.values())
