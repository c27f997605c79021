"""The batch tasks on the batch queue (``keys.BATCH_QUEUE``), run by the batch consumer
(web/batch_consumer.py), never by a web process: reading an input file into jobs, settling a
finished or expired batch into its output and error files, and the sweep that sends both.

Each is idempotent and survives its process: the reading keeps its progress (the input's byte
offset) in the batch's record, in the same transaction as each group's jobs, under a lease that
lapses when its process dies; settling writes the files under a lease and only then the final
stage. So a task run twice does the work once, and one that died midway is run again (its
message is acked late, and the sweep resends it) from where the last group ended.

A line becomes jobs exactly as the same request sent by its tenant would: the tasks run in a
request context of the batch's tenant (its key's policy and limits are read from Flask's ``g``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery
from flask import Flask, g

from trickle import keys
from trickle.queue import enqueue_batch_task
from web.batches.finalize import batch_store, settle
from web.batches.ingest import ingest
from web.batches.store import FINAL_STAGES, BatchRecord
from web.batches.sweeper import sweep
from web.services import Services, services

log = logging.getLogger(__name__)


@contextmanager
def as_owner(app: Flask, tenant_digest: str) -> Iterator[Services]:
    """A request context of ``tenant_digest``'s (the API key digest that made the batch)."""
    svc = services(app)
    with app.test_request_context("/v1/batches", method="POST"):
        g.api_key_digest = tenant_digest
        g.api_key = svc.tenants.by_digest(tenant_digest) if tenant_digest else None
        yield svc


def ingest_batch(app: Flask, batch_id: str) -> BatchRecord | None:
    """Reads the rest of a ``validating`` batch's input into jobs (nothing when another task
    is reading it, or it is past reading)."""
    store = batch_store(services(app))
    batch = store.record(batch_id)
    if batch is None or batch.stage != "validating":
        return batch
    with as_owner(app, batch.tenant_digest) as svc:
        found = ingest(svc, store, batch)
    if found.stage != "validating":
        log.info("batch %s: input read, %d lines, %s", batch_id, found.total, found.stage)
    return found


def settle_batch(svc: Services, batch_id: str) -> BatchRecord | None:
    """Writes a batch's files and final stage once its requests have all finished or its
    window is over (nothing before, nor once it is final)."""
    store = batch_store(svc)
    batch = store.record(batch_id)
    if batch is None or batch.stage in FINAL_STAGES:
        store.settled(batch_id)
        return batch
    found = settle(svc, store, batch)[0]
    if found.stage in FINAL_STAGES:
        log.info(
            "batch %s: %s, %s lines completed, %s failed",
            batch_id, found.stage, found.completed, found.failed,
        )  # fmt: skip
    return found


def register_batch_tasks(celery: Celery, app: Flask) -> None:
    """The batch tasks on ``celery``, each a call of the functions above; the sweep runs every
    ``files.batch_sweep_seconds`` (Celery beat, ``beat_schedule``)."""
    svc = services(app)
    interval = svc.settings.files.batch_sweep_seconds

    @celery.task(name=keys.BATCH_INGEST_TASK, ignore_result=True)
    def batch_ingest(batch_id: str) -> None:
        ingest_batch(app, batch_id)

    @celery.task(name=keys.BATCH_SETTLE_TASK, ignore_result=True)
    def batch_settle(batch_id: str) -> None:
        settle_batch(svc, batch_id)

    def send(task: str, batch_id: str) -> None:
        enqueue_batch_task(celery, task, batch_id, expires_seconds=interval)

    @celery.task(name=keys.BATCH_SWEEP_TASK, ignore_result=True)
    def batch_sweep() -> None:
        sweep(svc, interval, send)

    schedule: dict[str, Any] = {
        "task": keys.BATCH_SWEEP_TASK,
        "schedule": interval,
        # A turn nobody took in time is dropped: the next one is already on its way.
        "options": {"queue": keys.BATCH_QUEUE, "expires": interval},
    }
    celery.conf.beat_schedule = {"batch-sweep": schedule}
