"""What the web process shares between requests: settings, Redis, the queue client, the hub.

Every feature reads its parts here, so this module imports no feature at run time (only their
types, for the checker): ``web.wiring`` builds the parts and hands them in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis
from flask import Flask, current_app

from trickle.store.redis_connection import connect_pooled
from trickle.telemetry.tracing import Tracing
from trickle.tenants import TenantTable
from trickle.tokenization import Tokenizer, load_tokenizer

if TYPE_CHECKING:
    from celery import Celery

    from trickle.config.settings import Settings
    from trickle.queue import QueueReader
    from trickle.store.job_store import JobStore
    from trickle.waiting_reader import WaitEstimator
    from web.admission.depth import AdmissionDepth
    from web.admission.ratelimit import RateLimiter
    from web.batches.file_store import FileStore
    from web.batches.pending import PendingBatchJobs
    from web.common.answer_budget import AnswerBudget
    from web.common.request_models import RequestModels
    from web.openai.responses_api.store import ResponseStore
    from web.streams.hub import TokenHub
    from web.streams.tokens import StreamTokens

EXTENSION_KEY = "trickle"


@dataclass
class Services:
    settings: Settings
    redis: redis.Redis
    store: JobStore
    celery: Celery
    hub: TokenHub
    # Queued jobs' positions and expected starts, read for all this process's waiters at once.
    waiting: WaitEstimator
    rate_limiter: RateLimiter
    requests: RequestModels  # the request bodies, bound to this configuration's limits
    # Where each model's waiting jobs are counted (the 429 bound, /metrics, /scaling).
    queues: QueueReader
    # The queue-full check's count: a recent reading far below the limit, exact near it.
    admission_depth: AdmissionDepth
    # Stored Responses API responses; a record lives as long as its job can.
    responses: ResponseStore
    # Batch jobs accepted here whose task messages are still being sent (web/batches/pending.py).
    pending_batch: PendingBatchJobs
    # The parts built on first use, from what they are built of (web.wiring says how).
    files_over: Callable[[Any], FileStore]  # a FileStore over a client that answers bytes
    budget_for: Callable[[Tokenizer], AnswerBudget]
    load_stream_tokens: Callable[[], StreamTokens]  # reads (or creates) the shared secret
    # The broker is the job store's own Redis: a job's task rides in its record's transaction.
    tasks_ride_with_records: bool = False
    tenants: TenantTable = field(default_factory=lambda: TenantTable({}))
    tracing: Tracing = field(default_factory=Tracing.disabled)
    _tokenizers: dict[str, Tokenizer] = field(default_factory=dict)
    _budgets: dict[str, AnswerBudget] = field(default_factory=dict)
    _stream_tokens: StreamTokens | None = None
    _binary_redis: Any = None  # redis.Redis answering bytes, once files are used
    # ``threading.Lock`` looked up when a Services is built, not when this module is imported:
    # gunicorn's config imports ``web`` before gevent patches ``threading``, and a real lock
    # held across ``stream_tokens``' Redis read blocked the whole process (every greenlet, the
    # holder too) when two requests asked for their first stream URL at once.
    _lock: threading.Lock = field(default_factory=lambda: threading.Lock())

    def close(self) -> None:
        """Release Redis connections and stop the subscriber (tests; orderly shutdown)."""
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
                self._budgets[model] = self.budget_for(tokenizer)
            return self._budgets[model]

    @property
    def files(self) -> FileStore:
        """Stored files, over a client that answers bytes (a file is not text), opened on
        first use: a process nobody uploads to never opens its pool."""
        with self._lock:
            if self._binary_redis is None:
                self._binary_redis = connect_pooled(self.settings.redis, binary=True)
            client = self._binary_redis
        return self.files_over(client)

    def stream_tokens(self) -> StreamTokens:
        """The signer of stream tokens, its secret read (or created) on first use: an app that
        never hands out a stream URL never needs it, and start-up needs no Redis."""
        with self._lock:
            if self._stream_tokens is None:
                self._stream_tokens = self.load_stream_tokens()
            return self._stream_tokens


def services(app: Flask | None = None) -> Services:
    found: Services = (app or current_app).extensions[EXTENSION_KEY]
    return found
