"""The batch consumer: ``celery -A web.batch_consumer worker -Q trickle.batches`` (the
Procfile's ``batch`` line).

Batch work (reading an input file into jobs, settling finished batches into files, expiry, the
sweep) runs here as Celery tasks (web/batches/tasks.py), off the web processes: a request never
waits behind a batch, and a web process that dies loses no batch. It is the web tier's code (a
batch line becomes jobs exactly as its endpoint would make them), so it runs in a process of
the web tier's own, on a Flask app built as the web's is but never served: its request
context is how a task acts as the batch's tenant. It loads no model and imports no ``worker/``.

The sweep is sent by Celery beat, run as a thread of this process (``SweepClock``) rather
than as a Procfile line of its own: nothing more to supervise, and every batch consumer sends
it, so the sweep goes on while any one lives (a Redis lock gives each turn to one of them).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery, bootsteps
from celery.beat import EmbeddedService

from trickle.config.settings import load_settings
from web import create_app
from web.batches.tasks import register_batch_tasks
from web.services import services

# Batch tasks at once: a long reading never holds up a settle or a sweep.
THREADS = 4


class SweepClock(bootsteps.StartStopStep):  # type: ignore[misc]
    """Celery beat (the in-memory scheduler: ``beat_schedule`` is the whole schedule) in a
    thread, started with the worker and stopped with it; what ``celery worker -B`` does, but
    in a thread, never a child process that a killed consumer would leave behind."""

    def __init__(self, worker: Any, **kwargs: Any):
        super().__init__(worker, **kwargs)
        self.beat: Any = None

    def start(self, worker: Any) -> None:
        self.beat = EmbeddedService(worker.app, thread=True, scheduler_cls="celery.beat:Scheduler")
        self.beat.start()

    def stop(self, worker: Any) -> None:
        if self.beat is not None:
            self.beat.stop()
            self.beat = None

    shutdown = stop


def create_consumer_app() -> Celery:
    """The batch queue's Celery app, from settings loaded once from the file and environment."""
    flask_app = create_app(load_settings(environ=os.environ))
    # A sweep every few seconds would be three lines each; the tasks log what they change,
    # and task failures still come through at ERROR.
    for name in (
        "celery.worker.strategy",
        "celery.worker.request",
        "celery.app.trace",
        "celery.beat",
    ):
        logging.getLogger(name).setLevel(logging.WARNING)
    app = services(flask_app).celery  # the web's producer: the tasks' jobs go out on it too
    app.conf.worker_pool = "threads"
    app.conf.worker_concurrency = THREADS
    register_batch_tasks(app, flask_app)
    app.steps["worker"].add(SweepClock)
    return app


# What `celery -A web.batch_consumer` finds.
app = create_consumer_app()
