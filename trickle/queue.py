"""The one producer of generation tasks: the Celery app, its queues, and how deep they are.

Both tiers build their Celery app here: the web tier publishes by task name (without importing
the engine), the workers consume with Celery's own consumer (worker/dispatch.py). Every
generation job, whatever its origin (job API, OpenAI routes, batch lines, a requeue after a
crash, a hand-back at shutdown), is one ``send_task`` of ``trickle.generate`` with the job id as
its only argument; the job itself lives in Redis (trickle/store/job_store.py). Queues are declared
explicitly and missing ones are not created on the fly, so a typo in a model name fails loudly.

Priority is Celery's own, per broker:

- Redis (``redis://``, ``rediss://``, a Redis of its own): kombu keeps one list per priority
  step (``priority_steps``) and a worker's BRPOP names every queue's step-0 list before any
  queue's step-9 list, so a batch job (priority 9) never delays the fetch of an interactive
  one (0). Messages already prefetched are not reordered.
- RabbitMQ: each model's queue is a durable classic queue with ``x-max-priority``; RabbitMQ
  serves higher numbers first, so the Trickle priority is sent inverted (``broker_priority``).
  Quorum queues have no priorities before RabbitMQ 4.0 (Debian 12 ships 3.10).

Fair shares between keys come from queues too: with two keys or more (named ``[keys.<name>]``
or ``[auth] api_keys``, trickle/tenants.py) each key has its own queue per model (``weight`` of
them), and every worker consumes them all. On Redis kombu's
``queue_order_strategy = "round_robin"`` rotates the queue it just took from to the end of the
next BRPOP's list, within each priority step: a key's backlog delays another key's job by at
most one fetch (one freed slot) per worker, whatever its length, and a key of weight w, with w
queues, gets w turns per round. A worker prefetches no more than its slots (acks late, after
the job ends), so fetch order is run order. On RabbitMQ a worker consumes its queues on one
channel with a prefetch window; the broker sends from whichever queue has messages as the
window frees, with no promise of turns between queues (in practice it alternates), and a
message's priority orders only its own queue. Anonymous callers (no keys), and one key alone,
keep the model's one queue, so the single-tenant path is what it was. Turns count jobs; the
workers count tokens too (worker/fairness/vtc.py).

Either way the engine's scheduler puts interactive jobs first in its next batch.

Part of the contract: no engine import, the web tier uses it.
"""

from __future__ import annotations

import itertools
import ssl
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

import kombu.exceptions
from celery import Celery
from kombu import Exchange, Queue

from trickle import keys
from trickle.config.settings import Settings
from trickle.jobs import BATCH_PRIORITY, INTERACTIVE_PRIORITY
from trickle.store import redis_transport
from trickle.store.job_store import JobStore
from trickle.tenants import DEFAULT_TENANT, KeySettings

AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")
# The priorities a job can have; on Redis, each is one of kombu's priority steps.
PRIORITY_STEPS = (INTERACTIVE_PRIORITY, BATCH_PRIORITY)
# What a failed publish raises: kombu's connection errors (after Celery's retry policy).
BROKER_ERRORS = (kombu.exceptions.OperationalError, OSError)
# Where make_celery leaves the app's TenantQueues (app.conf).
TENANT_QUEUES_KEY = "trickle_tenant_queues"
# The most messages a worker's consumer takes after one BRPOP, in one round trip: a few, so
# workers sharing a queue still take turns (one that took all that waits starved the others of
# a burst: tests/system/test_operations.py::test_two_workers_share_a_burst).
DRAIN_MAX = 3
# How many of the oldest queued jobs (all models) to look through for a model's oldest one.
OLDEST_SCAN = 256


def is_amqp(url: str) -> bool:
    return url.partition("://")[0] in AMQP_SCHEMES


def _queue(name: str, amqp: bool) -> Queue:
    if not amqp:
        return Queue(name, routing_key=name)
    # Topic, not direct, so that a webhook retry's countdown can be routed back by name.
    exchange = Exchange(keys.AMQP_EXCHANGE, type="topic", durable=True)
    return Queue(name, exchange, routing_key=name, durable=True, max_priority=BATCH_PRIORITY)


class TenantQueues:
    """The Celery queues of each model: its own (the default tenant's) and one per weight unit
    of each key allowed on it. A key's jobs are spread over its queues in turn."""

    def __init__(self, models: Iterable[str], named: Mapping[str, KeySettings]):
        self._queues: dict[tuple[str, str], list[str]] = {}
        for model in models:
            self._queues[model, DEFAULT_TENANT] = [keys.model_queue(model)]
            for name, spec in named.items():
                if not spec.allowed_models or model in spec.allowed_models:
                    queues = [keys.tenant_queue(model, name, i) for i in range(spec.weight)]
                    self._queues[model, name] = queues
        self._turns = {where: itertools.cycle(names) for where, names in self._queues.items()}
        self._tenant_of = {
            name: tenant for (_, tenant), queues in self._queues.items() for name in queues
        }

    def names(self) -> list[str]:
        return [name for queues in self._queues.values() for name in queues]

    def of_model(self, model: str) -> list[str]:
        return [
            name for (found, _), queues in self._queues.items() if found == model for name in queues
        ]

    def of_tenant(self, model: str, tenant: str) -> list[str]:
        return self._queues.get((model, tenant)) or [keys.model_queue(model)]

    def has(self, model: str, tenant: str) -> bool:
        """Whether the tenant has queues of its own for the model."""
        return (model, tenant) in self._queues

    def of_key(self, tenant: str) -> list[str]:
        """Every queue of the tenant (all models)."""
        return [name for name, found in self._tenant_of.items() if found == tenant]

    def tenant_of(self, queue: str) -> str:
        return self._tenant_of.get(queue, DEFAULT_TENANT)

    def next_queue(self, model: str, tenant: str) -> str:
        """Where the tenant's next job for the model goes (its model's queue if it has none)."""
        turns = self._turns.get((model, tenant))
        return next(turns) if turns is not None else keys.model_queue(model)


def make_celery(settings: Settings, models: Iterable[str], batch_queue: bool = False) -> Celery:
    """The Celery app on ``settings.broker_url``, with one queue per model (per key and
    model, too; see TenantQueues) and the webhooks'; ``batch_queue``: the batch work's too
    (the web tier sends to it, the batch consumer takes from it; a generation worker, which
    consumes every queue its app declares, must not)."""
    amqp = is_amqp(settings.broker_url)
    app = Celery("trickle", broker=settings.broker_url, set_as_current=False)
    models = list(models)
    # One key alone keeps the model's queue (a named key's table still gives it its own).
    tenant_queues = TenantQueues(
        models, settings.tenants if settings.shares_slots else settings.keys
    )
    names = [
        *tenant_queues.names(),
        keys.WEBHOOK_QUEUE,
        *([keys.BATCH_QUEUE] if batch_queue else []),
    ]
    visibility = settings.worker.visibility_timeout_seconds
    transport: dict[str, Any] = {
        "visibility_timeout": visibility,
        # kombu looks for messages past it every interval x throttle seconds (100 by default);
        # every few seconds instead, so a task a killed worker held goes back within about
        # visibility + interval.
        "unacked_restore_interval": max(1, min(10, visibility // 3)),
        "unacked_restore_throttle": 1,
        "priority_steps": list(PRIORITY_STEPS),
        # Turns between queues (keys' fair shares); priority steps still come first.
        "queue_order_strategy": "round_robin",
        # Messages waiting behind a BRPOP come in one round trip (trickle/store/redis_transport.py),
        # except where keys' queues take turns.
        redis_transport.DRAIN_OPTION: (
            DRAIN_MAX if len(tenant_queues.names()) == len(models) else 0
        ),
    }
    if amqp:  # a job is accepted (202) only once RabbitMQ has confirmed its message
        transport = {"confirm_publish": True}
    app.conf.update(
        task_queues=[_queue(name, amqp) for name in names],
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
        # One broker connection per request in flight (a gevent web process serves hundreds):
        # kombu's default pool of 10 made the 11th concurrent POST wait for a connection.
        broker_pool_limit=settings.redis.max_connections,
        broker_transport_options=transport,
        worker_hijack_root_logger=False,
        # Task events only when asked for (Flower, `celery events`): each one is a message
        # between the POST and the job's start. Turning them on changes nothing else.
        worker_send_task_events=settings.worker.task_events,
        task_send_sent_event=settings.worker.task_events,
    )
    app.conf[TENANT_QUEUES_KEY] = tenant_queues
    if urlparse(settings.broker_url).scheme in ("redis", "rediss"):
        app.conf.broker_transport = redis_transport.TRANSPORT  # one client per channel
    if amqp:
        app.conf.task_default_exchange = keys.AMQP_EXCHANGE
        app.conf.task_default_exchange_type = "topic"
    elif urlparse(settings.broker_url).scheme == "rediss" and (
        "ssl_cert_reqs" not in settings.broker_url
    ):
        # kombu refuses a rediss:// URL without a certificate policy; verify by default.
        app.conf.broker_use_ssl = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    return app


def broker_priority(app: Celery, priority: int) -> int:
    """The message priority that serves Trickle's ``priority`` (0 first) on this app's broker:
    as is on Redis (lower first), inverted on RabbitMQ (higher first)."""
    return BATCH_PRIORITY - priority if is_amqp(app.conf.broker_url or "") else priority


def tenant_queues(app: Celery) -> TenantQueues:
    queues: TenantQueues = app.conf[TENANT_QUEUES_KEY]
    return queues


def enqueue_generation(
    app: Celery,
    job_id: str,
    model: str,
    priority: int = 0,
    producer: Any = None,
    tenant: str = DEFAULT_TENANT,
    declare: bool = True,
) -> None:
    """Publish the job's task on its model's queue (its key's, with two keys or more). Many sends in
    a row pass one ``producer`` (``app.producer_or_acquire()``) instead of one each.

    ``declare=False`` skips kombu's declaration of the queue: on kombu's Redis transport a task
    goes to the default (anonymous) exchange, an ``LPUSH`` to the queue's list that needs no
    binding, and kombu copied the queue and its exchange on every publish before finding the
    declaration cached. A broker that drops a message for a queue nobody declared (RabbitMQ)
    keeps the declaration."""
    options: dict[str, Any] = {} if declare else {"declare": []}
    app.send_task(
        keys.GENERATE_TASK,
        args=[job_id],
        queue=tenant_queues(app).next_queue(model, tenant),
        priority=broker_priority(app, priority),
        producer=producer,
        # What Celery's saferepr would write (inspect, Flower), without its generic walk.
        argsrepr=repr([job_id]),
        kwargsrepr="{}",
        **options,
    )


def tasks_ride_with_records(settings: Settings, store_is_cluster: bool) -> bool:
    """Whether a job's task message can go in its record's transaction: the broker is the job
    store's own (single) Redis, on Trickle's Redis transport."""
    return (
        not store_is_cluster
        and settings.broker_url == settings.redis.url
        and urlparse(settings.broker_url).scheme in ("redis", "rediss")
    )


@contextmanager
def publishing_into(producer: Any, pipe: Any) -> Iterator[None]:
    """Inside the block, ``producer``'s publishes queue their message on ``pipe`` (a pipeline
    or a script's write recorder) instead of sending it; the caller executes ``pipe``."""
    channel = producer.channel
    if not isinstance(channel, redis_transport.Channel):
        raise TypeError(f"publishing into a pipeline needs Trickle's Redis transport: {channel!r}")
    with channel.writing_into(pipe):
        yield


def enqueue_webhook(app: Celery, job_id: str) -> None:
    app.send_task(keys.WEBHOOK_TASK, args=[job_id], queue=keys.WEBHOOK_QUEUE)


def enqueue_batch_task(
    app: Celery, task: str, batch_id: str, expires_seconds: float | None = None
) -> None:
    """Send one of the batch tasks (``keys.BATCH_*_TASK``) for ``batch_id`` to the batch
    queue; ``expires_seconds``: a copy nobody took by then is dropped (the sweep sends another
    on its next turn)."""
    app.send_task(task, args=[batch_id], queue=keys.BATCH_QUEUE, expires=expires_seconds)


class QueueReader:
    """How many jobs wait for a worker (the broker's own count of ready messages, every
    priority; prefetched ones wait no more), and how old the oldest is (Redis's queued index:
    no broker can peek at a queue's head through Celery)."""

    def __init__(self, app: Celery, store: JobStore):
        self._app = app
        self._store = store

    def depth(self, model: str, tenant: str | None = None, priority: int | None = None) -> int:
        """Jobs waiting for the model: all of them, or only ``tenant``'s; with ``priority``,
        only the jobs of that priority step (on Redis; RabbitMQ counts no priority apart, so
        there every priority counts)."""
        queues = tenant_queues(self._app)
        names = queues.of_model(model) if tenant is None else queues.of_tenant(model, tenant)
        if priority is not None and not is_amqp(self._app.conf.broker_url or ""):
            return self._step_depth(names, priority)
        with self._app.pool.acquire(block=True) as conn:
            conn.ensure_connection(max_retries=1)
            channel = conn.default_channel
            if not is_amqp(self._app.conf.broker_url or ""):
                # Every queue's every priority step in one round trip: a deployment of hundreds
                # of keys has hundreds of queues per model, read on every reading of the
                # autoscaler and the queue-full check.
                return _lengths(channel, names, channel.priority_steps)
            # RabbitMQ: declaring with the same arguments is idempotent and answers the count
            # (a passive declaration would fail for a queue that no worker has declared yet).
            total = 0
            for name in names:
                queue = self._app.amqp.queues[name]
                total += int(queue.bind(channel).queue_declare().message_count)
            return total

    def batch_depth(self, model: str) -> int:
        """Batch-priority jobs waiting for the model (every key's): on Redis, the length of
        each queue's batch priority step; RabbitMQ counts no priority apart, so 0 there."""
        if is_amqp(self._app.conf.broker_url or ""):
            return 0
        return self._step_depth(tenant_queues(self._app).of_model(model), BATCH_PRIORITY)

    def _step_depth(self, names: Iterable[str], priority: int) -> int:
        """On kombu's Redis transport, the summed length of one priority step's lists."""
        with self._app.pool.acquire(block=True) as conn:
            conn.ensure_connection(max_retries=1)
            return _lengths(conn.default_channel, names, (priority,))

    def oldest_queued_seconds(self, model: str, now: float) -> float:
        """Age of the model's oldest queued job, from the queued index (by deadline)."""
        entries = self._store.oldest_queued(OLDEST_SCAN)
        if not entries:
            return 0.0
        pipe = self._store.redis.pipeline(transaction=False)
        for job_id in entries:
            pipe.hmget(keys.job(str(job_id)), ["model", "created_at"])
        for found_model, created in pipe.execute():
            if found_model == model and created is not None:
                return max(now - float(created), 0.0)
        return 0.0


def _lengths(channel: Any, names: Iterable[str], priorities: Iterable[int]) -> int:
    """Messages in kombu's Redis lists of ``names`` at ``priorities``, in one round trip."""
    with channel.conn_or_acquire() as client:
        pipe = client.pipeline(transaction=False)
        for name in names:
            for priority in priorities:
                pipe.llen(channel._q_for_pri(name, priority))
        return sum(int(size) for size in pipe.execute())
