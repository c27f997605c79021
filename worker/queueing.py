"""The Celery side of the contract: one app factory, explicit queues, JSON only.

Both tiers build their Celery app here: the web tier to enqueue by task name (without importing
the engine), the workers to consume. Queues are declared explicitly and missing ones are not
created on the fly, so a typo in a model name fails loudly instead of parking jobs forever.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import uuid
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlparse

import redis
from celery import Celery
from kombu import Queue

from worker import keys
from worker.amqp_queues import AmqpQueueReader, amqp_conf, amqp_queues, batch_queue_of, is_amqp
from worker.broker_transport import TRANSPORT_PATH as BROKER_TRANSPORT
from worker.capacity import PRIORITY_STEPS, QueueReader, RedisQueueReader
from worker.config import Settings
from worker.jobs import BATCH_PRIORITY
from worker.redis_connection import client_options


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
    scheme = urlparse(settings.broker_url).scheme
    if scheme == "redis":
        app.conf.broker_transport = BROKER_TRANSPORT
    if is_amqp(settings.broker_url):
        app.conf.update(task_queues=amqp_queues(models, settings.broker.delivery_limit))
        app.conf.update(amqp_conf())
    elif scheme == "rediss" and "ssl_cert_reqs" not in settings.broker_url:
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


class GenerationPusher:
    """Sends a generation task on the Redis transport as the one ``LPUSH`` that Celery's
    ``send_task`` ends in, with the message it would build (task protocol 2, JSON, base64 body).

    ``send_task`` spends about 1.4 ms of Python per job (signatures, routing, kombu's producer)
    on the web tier's path to the first token, against 0.13 ms for the push itself; a burst of
    new clients waits on that CPU. Only for the Redis transport with task events off (an event
    would be one more message); everything else goes through ``send_task``.
    ``tests/integration/test_queueing.py`` checks the message against the one ``send_task`` builds.
    """

    def __init__(self, client: redis.Redis, reply_to: str, shares_store: bool = False):
        self._client = client
        self._reply_to = reply_to
        # The broker is the job store's own Redis: a message can ride in the job's transaction.
        self.shares_store = shares_store
        self._origin = f"gen{os.getpid()}@{socket.gethostname()}"

    def message(self, job_id: str, model: str, priority: int) -> dict[str, Any]:
        task_id = str(uuid.uuid4())
        embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
        body = json.dumps([[job_id], {}, embed]).encode()
        return {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {
                "lang": "py",
                "task": keys.GENERATE_TASK,
                "id": task_id,
                "shadow": None,
                "eta": None,
                "expires": None,
                "group": None,
                "group_index": None,
                "retries": 0,
                "timelimit": [None, None],
                "root_id": task_id,
                "parent_id": None,
                "argsrepr": repr([job_id]),
                "kwargsrepr": "{}",
                "origin": self._origin,
                "ignore_result": None,
                "replaced_task_nesting": 0,
                "stamped_headers": None,
                "stamps": {},
            },
            "properties": {
                "correlation_id": task_id,
                "reply_to": self._reply_to,
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": keys.model_queue(model)},
                "priority": priority,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }

    def push(self, job_id: str, model: str, priority: int = 0) -> None:
        self.push_into(self._client, job_id, model, priority)

    def push_into(self, pipe: Any, job_id: str, model: str, priority: int = 0) -> None:
        """Queue the push on ``pipe`` (a pipeline of the broker's Redis, or its client)."""
        message = json.dumps(self.message(job_id, model, priority))
        pipe.lpush(keys.model_queue_list(model, priority), message)


def direct_feed(settings: Settings) -> bool:
    """Generation tasks bypass Celery at both ends (the web tier pushes them, the worker's
    ``JobFeeder`` takes them): a plain ``redis://`` broker with task events off, the default.
    RabbitMQ, TLS brokers and task events (Flower) keep Celery's producer and consumer."""
    return urlparse(settings.broker_url).scheme == "redis" and not settings.worker.task_events


def generation_pusher(
    settings: Settings, app: Celery, jobs_client: Any = None
) -> GenerationPusher | None:
    """The direct pusher where the broker is plain Redis and task events are off, else None
    (``enqueue_generation`` then sends through Celery). ``jobs_client`` (the job store's
    client) is reused when the broker is that same Redis."""
    url = settings.broker_url
    if not direct_feed(settings):
        return None
    if jobs_client is not None and url == settings.redis.url:
        return GenerationPusher(jobs_client, app.thread_oid, shares_store=True)
    client = redis.Redis.from_url(url, **client_options(settings.redis))
    return GenerationPusher(client, app.thread_oid)


def queue_reader(settings: Settings, app: Celery, client: redis.Redis) -> QueueReader:
    """Where depth and the oldest waiting job are read: the broker's queues, wherever they are."""
    if is_amqp(settings.broker_url):
        return AmqpQueueReader(app, client)
    if settings.broker.url:  # a Redis of its own (the job state may be on a cluster)
        broker = redis.Redis.from_url(settings.broker.url, **client_options(settings.redis))
        return RedisQueueReader(broker, jobs=client)
    return RedisQueueReader(client)
