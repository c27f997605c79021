"""Restarting rows of a running batch: the one way work moves between CTranslate2 calls.

CTranslate2 cannot add a row to a running ``generate_batch``, nor rewind one (its issue 1333),
so every move is a restart: the lane stops each row of the batch at its next token and runs
the batch again at once, each row from its prompt plus the ids it streamed (plus any forced
ids of its ``RowResume``), together with any joiners. Admission (a newcomer joins), rebalancing
(a split gives half to an idle lane) and any later user (grammar-constrained decoding resuming
a row from its accepted prefix plus a forced token) all ask for it through one entry point,
``BatchScheduler.restart_rows``, which records the restart on the ``RunningBatch`` under the
scheduler's lock; the lane applies it with ``resume_rows`` once the engine call returns.

What a restart costs (``worker.engine.policy`` prices it): CTranslate2 forwards the shortest
row of the new batch in one pass and feeds every longer row's extra ids one per step, so a row
longer than the shortest pauses that many steps, while the shortest (a newcomer, usually)
speaks at the first step. Nothing is streamed twice: a resumed row's ids are fed as prompt,
never emitted again, and its sequence state (detokenizer, count, stop strings) goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from worker.engine.batch import RunningBatch, StepSink
from worker.engine.scheduled import ScheduledJob
from worker.publish_items import TokenItem


@dataclass(frozen=True)
class RowResume:
    """Where one row of a restarted batch goes on from: what it streamed, then ``forced``.

    A row resumes from every id its sequence state accounted for (``generated_ids``: streamed,
    in order); an id cannot be taken back once streamed. A caller that must cut a row short of
    a token (a grammar rejecting it) stops the row before that token reaches its state (the
    step callback returning True for it), so the accepted prefix is exactly what it streamed.
    ``forced`` ids are emitted by the restart as the row's next tokens (streamed, counted,
    checked against max_tokens and stop strings like generated ones) and fed as prompt after
    the prefix; the row then generates on from there."""

    forced: tuple[int, ...] = ()


def resume_rows(running: RunningBatch, publish_step: StepSink) -> list[ScheduledJob]:
    """Apply a due restart to ``running`` once its engine call returned: emit each row's
    forced ids, and return the live rows (the survivors), each set to go on from its resume
    point (``current_request`` continues from prompt + ``generated_ids``). Under the
    scheduler's lock, so no later ``restart_rows`` changes the order meanwhile."""
    items: list[TokenItem] = []
    for job in running.live_jobs():
        if job.error is not None:
            continue
        for token_id in running.forced.get(id(job), ()):
            item = emit(job, token_id)
            if item is not None:
                items.append(item)
            if job.state.finished:
                break
    if items:
        publish_step(tuple(items))
    survivors = [job for job in running.live_jobs() if job.error is None]
    for job in survivors:
        job.restarts += 1
    return survivors


def emit(job: ScheduledJob, token_id: int) -> TokenItem | None:
    """Account for ``token_id`` as ``job``'s next token, as if the engine had generated it:
    the token item to publish (None when the state emits nothing, e.g. a stop already due)."""
    outcome = job.state.on_token(token_id, False)
    if outcome.index is None:
        return None
    job.generated_ids.append(token_id)
    now = time.time()
    if job.first_token_at is None:
        job.first_token_at = now
    job.last_token_at = now
    first = now if outcome.index == 0 else None
    return TokenItem(job.token_event(outcome), job.fence, first)
