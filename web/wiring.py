"""Builds the web process's ``Services``: the one module that knows every feature's parts."""

from __future__ import annotations

from trickle.config.settings import Settings
from trickle.jobs import INTERACTIVE_PRIORITY
from trickle.queue import QueueReader, make_celery, tasks_ride_with_records
from trickle.store.job_store import JobStore
from trickle.store.redis_connection import connect_pooled, connect_subscriber
from trickle.tenants import TenantTable
from trickle.waiting_reader import WaitEstimator
from web.admission.depth import AdmissionDepth
from web.admission.ratelimit import RateLimiter
from web.batches.file_store import FileStore
from web.batches.pending import PendingBatchJobs
from web.common.answer_budget import AnswerBudget
from web.common.request_models import RequestModels
from web.openai.responses_api.store import ResponseStore
from web.services import Services
from web.streams.hub import TokenHub
from web.streams.tokens import StreamTokens, load_secret


def build_services(settings: Settings) -> Services:
    """Connects to Redis and the broker and builds each part from the settings, once."""
    client = connect_pooled(settings.redis)
    celery = make_celery(settings, settings.models, batch_queue=True)
    limits = settings.limits
    store = JobStore(client, limits.result_ttl_seconds, limits.queued_ttl_seconds)
    queues = QueueReader(celery, store)
    return Services(
        settings=settings,
        redis=client,
        store=store,
        celery=celery,
        hub=TokenHub(lambda: connect_subscriber(settings.redis)),
        waiting=WaitEstimator(client, settings.worker.heartbeat_ttl_seconds, settings.models),
        rate_limiter=RateLimiter(settings),
        requests=RequestModels.bound_to(settings),
        queues=queues,
        # Interactive jobs only: batch work has a bound of its own (limits.max_batch_backlog)
        # and never closes the interactive queue.
        admission_depth=AdmissionDepth(
            lambda model: queues.depth(model, priority=INTERACTIVE_PRIORITY)
        ),
        responses=ResponseStore(client, limits.queued_ttl_seconds + limits.result_ttl_seconds),
        pending_batch=PendingBatchJobs(),
        files_over=lambda binary: FileStore(binary, settings.files),
        budget_for=AnswerBudget,
        load_stream_tokens=lambda: StreamTokens(load_secret(client, settings.web.stream_secret)),
        tasks_ride_with_records=tasks_ride_with_records(settings, store.cluster),
        tenants=TenantTable(settings.tenants),
    )
