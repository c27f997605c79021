"""What the web process shares between requests: settings, Redis, the queue client, the hub."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import Celery
from flask import Flask, current_app

from trickle.config.settings import Settings
from trickle.jobs import INTERACTIVE_PRIORITY
from trickle.queue import QueueReader, make_celery, tasks_ride_with_records
from trickle.store.job_store import JobStore
from trickle.store.redis_connection import connect_pooled, connect_subscriber
from trickle.telemetry.tracing import Tracing
from trickle.tenants import TenantTable
from trickle.tokenization import Tokenizer, load_tokenizer
from web.admission_depth import AdmissionDepth
from web.answer_budget import AnswerBudget
from web.batch_pending import PendingBatchJobs
from web.file_store import FileStore
from web.hub import TokenHub
from web.ratelimit import RateLimiter
from web.request_models import RequestModels
from web.responses_store import ResponseStore
from web.stream_tokens import StreamTokens, load_secret

EXTENSION_KEY = "trickle"


@dataclass
class Services:
    settings: Settings
    redis: redis.Redis
    store: JobStore
    celery: Celery
    hub: TokenHub
    rate_limiter: RateLimiter
    requests: RequestModels  # the request bodies, bound to this configuration's limits
    # Where each model's waiting jobs are counted (the 429 bound, /metrics, /scaling).
    queues: QueueReader
    # The queue-full check's count: a recent reading far below the limit, exact near it.
    admission_depth: AdmissionDepth
    # The broker is the job store's own Redis: a job's task rides in its record's transaction.
    tasks_ride_with_records: bool = False
    tenants: TenantTable = field(default_factory=lambda: TenantTable({}))
    tracing: Tracing = field(default_factory=Tracing.disabled)
    # Batch jobs accepted here whose task messages are still being sent (web/batch_backlog.py).
    pending_batch: PendingBatchJobs = field(default_factory=PendingBatchJobs)
    # Stopped with the Services (the batch sweeper's thread, web/batch_sweeper.py).
    on_close: list[Callable[[], None]] = field(default_factory=list)
    _tokenizers: dict[str, Tokenizer] = field(default_factory=dict)
    _budgets: dict[str, AnswerBudget] = field(default_factory=dict)
    _stream_tokens: StreamTokens | None = None
    _binary_redis: Any = None  # redis.Redis answering bytes, once files are used
    # ``threading.Lock`` looked up when a Services is built, not when this module is imported:
    # gunicorn's config imports ``web`` before gevent patches ``threading``, and a real lock
    # held across ``stream_tokens``' Redis read blocked the whole process (every greenlet, the
    # holder too) when two requests asked for their first stream URL at once.
    _lock: threading.Lock = field(default_factory=lambda: threading.Lock())

    @classmethod
    def create(cls, settings: Settings) -> Services:
        client = connect_pooled(settings.redis)
        celery = make_celery(settings, settings.models)
        limits = settings.limits
        store = JobStore(client, limits.result_ttl_seconds, limits.queued_ttl_seconds)
        queues = QueueReader(celery, store)
        return cls(
            settings=settings,
            redis=client,
            store=store,
            celery=celery,
            hub=TokenHub(lambda: connect_subscriber(settings.redis)),
            rate_limiter=RateLimiter(settings),
            requests=RequestModels.bound_to(settings),
            queues=queues,
            # Interactive jobs only: batch work has a bound of its own (limits.max_batch_backlog)
            # and never closes the interactive queue.
            admission_depth=AdmissionDepth(
                lambda model: queues.depth(model, priority=INTERACTIVE_PRIORITY)
            ),
            tasks_ride_with_records=tasks_ride_with_records(settings, store.cluster),
            tenants=TenantTable(settings.tenants),
        )

    def close(self) -> None:
        """Release Redis connections and stop the subscriber (tests; orderly shutdown)."""
        for stop in self.on_close:
            stop()
        self.hub.close()
        for client in (self.redis, self._binary_redis):
            if client is None:
                continue
            client.close()
            pool = getattr(client, "connection_pool", None)  # a cluster client: one per node
            if pool is not None:
                pool.disconnect()

    def tokenizer(self, model: str) -> Tokenizer:
        """The model's tokenizer, loaded on first use (for prompt limits; no CTranslate2 here)."""
        with self._lock:
            if model not in self._tokenizers:
                spec = self.settings.model(model)
                self._tokenizers[model] = load_tokenizer(spec)
            return self._tokenizers[model]

    def answer_budget(self, model: str) -> AnswerBudget:
        """The model's grammar checks, built on first use (a constrained request's budget)."""
        tokenizer = self.tokenizer(model)
        with self._lock:
            if model not in self._budgets:
                self._budgets[model] = AnswerBudget(tokenizer)
            return self._budgets[model]

    @property
    def responses(self) -> ResponseStore:
        """Stored Responses API responses; a record lives as long as its job can."""
        limits = self.settings.limits
        return ResponseStore(self.redis, limits.queued_ttl_seconds + limits.result_ttl_seconds)

    @property
    def files(self) -> FileStore:
        """Stored files, over a client that answers bytes (a file is not text), opened on
        first use: a process nobody uploads to never opens its pool."""
        with self._lock:
            if self._binary_redis is None:
                self._binary_redis = connect_pooled(self.settings.redis, binary=True)
            client = self._binary_redis
        return FileStore(client, self.settings.files.retention_seconds)

    def stream_tokens(self) -> StreamTokens:
        """The signer of stream tokens, its secret read (or created) on first use: an app that
        never hands out a stream URL never needs it, and start-up needs no Redis."""
        with self._lock:
            if self._stream_tokens is None:
                secret = load_secret(self.redis, self.settings.web.stream_secret)
                self._stream_tokens = StreamTokens(secret)
            return self._stream_tokens


def services(app: Flask | None = None) -> Services:
    found: Services = (app or current_app).extensions[EXTENSION_KEY]
    return found
