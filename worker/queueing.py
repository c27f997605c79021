"""The Celery side of the contract: one app factory, explicit queues, JSON only.

Both tiers build their Celery app here: the web tier to enqueue by task name (without importing
the engine), the workers to consume. Queues are declared explicitly and missing ones are not
created on the fly, so a typo in a model name fails loudly instead of parking jobs forever.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlparse

import redis
from celery import Celery
from kombu import Queue

from worker import keys
from worker.amqp_queues import AmqpQueueReader, amqp_conf, amqp_queues, batch_queue_of, is_amqp
from worker.capacity import PRIORITY_STEPS, QueueReader, RedisQueueReader
from worker.config import Settings
from worker.jobs import BATCH_PRIORITY


def make_celery(settings: Settings, models: Iterable[str]) -> Celery:
    """The Celery app on ``settings.broker_url``: Redis lists, or RabbitMQ quorum queues."""
    models = list(models)
    app = Celery("trickle", broker=settings.broker_url, set_as_current=False)
    names = [keys.model_queue(name) for name in models] + [keys.WEBHOOK_QUEUE]
    queues = [Queue(name, routing_key=name) for name in names]
    app.conf.update(
        task_queues=queues,
        task_default_queue=keys.model_queue(settings.default_model),
        task_create_missing_queues=False,
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": settings.worker.visibility_timeout_seconds,
            "priority_steps": list(PRIORITY_STEPS),
        },
        worker_hijack_root_logger=False,
        # Task events only when asked for (Flower, `celery events`): each one is a round trip
        # between the POST and the job's start.
        worker_send_task_events=settings.worker.task_events,
        task_send_sent_event=settings.worker.task_events,
    )
    if is_amqp(settings.broker_url):
        app.conf.update(task_queues=amqp_queues(models, settings.broker.delivery_limit))
        app.conf.update(amqp_conf())
    elif (
        urlparse(settings.broker_url).scheme == "rediss"
        and "ssl_cert_reqs" not in settings.broker_url
    ):
        # kombu refuses a rediss:// URL without a certificate policy; verify by default.
        app.conf.broker_use_ssl = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    return app


def enqueue_webhook(app: Celery, job_id: str) -> None:
    app.send_task(keys.WEBHOOK_TASK, args=[job_id], queue=keys.WEBHOOK_QUEUE)


def enqueue_generation(
    app: Celery, job_id: str, model: str, priority: int = 0, producer: Any = None
) -> None:
    """Send a job id to its model's queue; the job itself lives in Redis (see store).

    On the Redis transport each priority is its own list and workers read lower numbers
    first, so batch work (BATCH_PRIORITY) never delays an interactive job's fetch. On RabbitMQ
    batch work goes to the model's batch queue instead (see amqp_queues). Many sends in a row
    pass one ``producer`` (``app.producer_or_acquire()``) instead of one each.
    """
    batch_queue = batch_queue_of(app, model) if priority >= BATCH_PRIORITY else None
    app.send_task(
        keys.GENERATE_TASK,
        args=[job_id],
        queue=batch_queue or keys.model_queue(model),
        priority=priority,
        producer=producer,
    )


def queue_reader(settings: Settings, app: Celery, client: redis.Redis) -> QueueReader:
    """Where depth and the oldest waiting job are read: the broker's queues, wherever they are."""
    if is_amqp(settings.broker_url):
        return AmqpQueueReader(app, client)
    return RedisQueueReader(client)
