"""The sections of the configuration: one frozen dataclass per TOML table, with its defaults.

What each key means and why its default is what it is lives here, beside the key; how the
layers (defaults, file, environment) are read, merged and checked lives in ``config.settings``,
which assembles these into ``Settings``. Unknown keys are errors (``Section``), in the file and
the environment alike.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, NonNegativeFloat, PositiveInt

from trickle.config.base import Section
from trickle.config.lanes import Lanes, SpareUse
from trickle.config.sampling import ModelSampling
from trickle.config.tuning import ModelTuning


def _comma_separated(value: Any) -> Any:
    """Lists from the environment are comma-separated (``TRICKLE_API_KEYS=a,b``)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


Names = Annotated[tuple[str, ...], BeforeValidator(_comma_separated)]
Numbers = Annotated[tuple[int, ...], BeforeValidator(_comma_separated)]
# A Unix nice value a process may lower itself to without privileges (0: as its parent).
Niceness = Annotated[int, Field(ge=0, le=19)]


@dataclass(frozen=True)
class RedisSettings(Section):
    url: str = "redis://127.0.0.1:6399/0"
    socket_timeout_seconds: float = 5.0
    # Per process: requests wait for a free connection rather than opening one each.
    max_connections: int = 64
    # The embedded Redis's (``trickle up``) append-only file: "everysec" can lose the last
    # second of acknowledged writes in a crash (tokens lost there are restored by their worker;
    # jobs accepted there are gone), "always" loses nothing at an fsync per write. See
    # docs/guarantees.md, Persistence.
    appendfsync: Literal["always", "everysec", "no"] = "everysec"


@dataclass(frozen=True)
class BrokerSettings(Section):
    """Where Celery's job queue lives; Redis keeps job state, replay logs and tokens either way."""

    # Empty: the queue shares Redis (redis.url; not possible on a Redis Cluster, see README
    # Scaling out). redis://host:6379/0: a Redis of its own. amqp://user:pass@host:5672/vhost:
    # RabbitMQ, with a durable priority queue per model (trickle/queue.py).
    url: str = ""


@dataclass(frozen=True)
class WebSettings(Section):
    host: str = "127.0.0.1"
    port: int = 8000
    keepalive_seconds: float = 15.0
    # gunicorn worker processes (gevent: each holds thousands of streams). More than one spreads
    # request handling (validation, tokenization, enqueueing, stream set-up) over cores, which
    # is what a burst of new clients waits on; each process keeps its own pub/sub connection.
    processes: int = 1
    max_body_bytes: int = 1_048_576
    max_wait_seconds: int = 60
    # Non-streaming OpenAI requests give up (504, jobs canceled) after this long.
    completion_timeout_seconds: float = 600.0
    # A streamed OpenAI request with an Idempotency-Key whose client leaves keeps its jobs
    # running this long, so that its retry re-attaches (replay from the first token, then
    # follow to the end) instead of finding them canceled. 0: canceled at once, as streams
    # without a key always are.
    stream_resume_grace_seconds: float = 30.0
    # HMAC key of the read-only stream tokens in job URLs; empty: one generated and shared
    # through Redis (keys.STREAM_SECRET), so every web process signs alike.
    stream_secret: str = ""
    # Origins (scheme://host[:port], or "*") allowed to call /v1 from a browser; empty: none.
    cors_origins: Names = ()
    # A job's WebSocket takes no input: what a client sends is read and dropped. One message
    # (all its frames) over ws_max_message_bytes closes the socket with 1009, more than
    # ws_inbound_budget_bytes in all with 1008, so no client can make the web process hold more.
    ws_max_message_bytes: PositiveInt = 4096
    ws_inbound_budget_bytes: PositiveInt = 65536
    # Once no request has begun for this long the web process hands its free heap back to the
    # OS (``malloc_trim``, trickle/heap.py), so a flood's memory does not stay; 0 = never.
    trim_after_idle_seconds: NonNegativeFloat = 5.0


@dataclass(frozen=True)
class WorkerSettings(Section):
    # Models this worker process serves; empty means every configured model.
    models: Names = ()
    heartbeat_seconds: float = 2.0
    heartbeat_ttl_seconds: float = 10.0
    # A worker holds a lease on each job it runs and renews it every lease/3; a job whose lease
    # lapses (its worker died) is requeued by any live worker's sweep, and resumes where its
    # stream stopped. Recovery takes at most lease_seconds + recovery_interval_seconds.
    lease_seconds: float = 10.0
    recovery_interval_seconds: float = 2.0
    # A job still queued this long after its submission while its model's queue is empty has
    # lost its task (the web process died between the record and the publish): a live worker
    # publishes it again (a duplicate is harmless: only one claim can take a queued job).
    republish_after_seconds: float = 30.0
    # Claims per job: past this, a job whose workers keep dying fails instead of looping.
    max_attempts: int = 3
    # Redis brokers: kombu puts a delivered, unacknowledged message back on its queue after this
    # long (a worker killed before it claimed the job). Shorter than a long job is safe: leases
    # decide who runs a job, so a redelivered task of a running or finished job is only acked.
    visibility_timeout_seconds: int = 60
    # How long a worker keeps retrying Redis before giving a job up.
    redis_retry_seconds: float = 300.0
    # Celery task events (sent, received, started, succeeded) for Flower or `celery events`.
    # Off by default: each is a Redis PUBLISH on the path from POST to the first token.
    task_events: bool = False


@dataclass(frozen=True)
class LimitSettings(Section):
    max_prompt_tokens: int = 2048
    max_tokens_ceiling: int = 2048
    default_max_tokens: int = 128
    max_stop_sequences: int = 4
    max_stop_chars: int = 64
    result_ttl_seconds: int = 3600
    # A job never picked up (no worker for its model) expires after this.
    queued_ttl_seconds: int = 86_400
    # Per model: beyond this many waiting interactive jobs, submissions get 429 instead of
    # queueing forever. Batch jobs wait apart, under max_batch_backlog.
    max_queued_jobs: int = 1000
    # A running job is stopped and failed after this long (from its first start).
    max_job_seconds: float = 600.0
    # POST /v1/batches: requests per batch and size of the JSONL input.
    max_batch_requests: int = 10_000
    max_batch_bytes: int = 16_777_216
    # Jobs one batch may create (each line makes prompts x n jobs), and the most batch jobs
    # that may wait per model and key (the anonymous and auth.api_keys callers share one):
    # batch work is bounded apart, so it never closes the interactive queue.
    max_batch_jobs: int = 10_000
    max_batch_backlog: int = 50_000
    # The input one key's live batches may hold in Redis (JSONL bodies, input files' sizes):
    # a batch keeps its lines until it expires. Past it a batch gets 429 batch_storage_full.
    max_batch_input_bytes_per_key: int = 268_435_456


@dataclass(frozen=True)
class FileSettings(Section):
    """``/v1/files``: stored in the job store's Redis (the one store the stack has), so every
    byte counts against its memory; these bound it per file and per key."""

    max_file_bytes: int = 67_108_864
    max_bytes_per_key: int = 268_435_456
    # Live files per key (uploads and batch outputs): each costs a record whatever its size.
    max_files_per_key: int = 1000
    # An uploaded file, and a batch's output and error files, are deleted after this long.
    retention_seconds: int = 604_800
    # How long a batch's finished requests keep their results (and the batch its record) for
    # its output files, however long ``limits.result_ttl_seconds`` is: its completion window.
    batch_window_seconds: int = 86_400
    # How often the batch consumer (a Redis lock picks one) sweeps the unsettled batches: each
    # finished or expired one is settled into its files, a stalled reading is resumed. A read
    # never settles a batch, so this is how long a finished batch may still show in_progress.
    batch_sweep_seconds: float = 5.0


@dataclass(frozen=True)
class RateLimitSettings(Section):
    # Per API key (per client address without keys) and per minute; 0 disables a limit.
    requests_per_minute: int = 0
    tokens_per_minute: int = 0  # prompt tokens + max_tokens, reserved at submission


@dataclass(frozen=True)
class WebhookSettings(Section):
    # Hosts a job's webhook_url may name; empty: webhooks are refused (no open SSRF relay).
    allowed_hosts: Names = ()
    secret: str = ""  # HMAC key for X-Trickle-Signature
    # Ports a webhook_url may name (its scheme's default when it names none); empty: any.
    allowed_ports: Numbers = ()
    # An allowed host that resolves to a loopback, private, link-local or otherwise internal
    # address is refused at delivery unless this is true (a test receiver on 127.0.0.1).
    allow_private_addresses: bool = False
    max_attempts: int = 5
    timeout_seconds: float = 5.0


@dataclass(frozen=True)
class AutoscaleSettings(Section):
    """`trickle up --workers MIN:MAX`: worker processes follow each served model's queue."""

    # A worker with no job for this long stops (down to MIN, which may be 0).
    idle_seconds: float = 60.0
    # How often the launcher reads queue depth, oldest queued age and worker slots.
    interval_seconds: float = 0.25
    # Jobs waiting this long while every live slot is busy add a worker beyond the slot count.
    scale_up_after_seconds: float = 2.0
    # Workers that batch-priority demand alone may start (0: batch runs only on the capacity
    # interactive work leaves, or MIN's); unset: batch counts like interactive demand.
    max_batch_workers: int | None = None
    # Something outside Trickle (KEDA, an HPA) starts workers on demand: /readyz then treats
    # zero live workers as ready, as it does while `trickle up` autoscales.
    external_scaler: bool = False


@dataclass(frozen=True)
class SupervisorSettings(Section):
    """`trickle up` restarts any Procfile process (and the embedded Redis) that dies."""

    # The first restart is immediate; the next waits this long, doubling per death up to the max.
    restart_delay_seconds: float = 0.5
    max_restart_delay_seconds: float = 10.0
    # A process that dies crash_limit times within crash_window_seconds is left stopped.
    crash_limit: int = 5
    crash_window_seconds: float = 60.0
    # Ctrl-C/SIGTERM: processes get SIGTERM, then SIGKILL after this (Redis stops last).
    stop_timeout_seconds: float = 7.0
    # Import Celery, CTranslate2 and the worker code once in the launcher and fork each
    # `celery` Procfile process from it: a worker's cold start loses the interpreter's imports.
    preload_workers: bool = True
    # The batch consumer (the Procfile's `batch` line) runs at this nice value, so its bursts
    # (reading a large input into jobs, settling it into files) wait for a core behind the
    # web tier, whose /healthz and requests must answer at once (ops/priority.py). Workers
    # stay at 0: they serve interactive jobs too.
    batch_niceness: Niceness = 10


@dataclass(frozen=True)
class AuthSettings(Section):
    # Accepted bearer tokens: plain keys or "sha256:<hex>" digests of keys. Empty: no auth.
    api_keys: Names = ()
    # Bearer token for GET /metrics (plain or "sha256:<hex>"). Empty: /metrics is as open as
    # the API (any API key when keys are set, nobody's business otherwise).
    metrics_token: str = ""


@dataclass(frozen=True)
class ModelSettings(Section):
    name: str
    path: str
    # The tokenizer file; empty: the directory's tokenizer.json, else tokenizer.model
    # (trickle/tokenization/loading.py).
    tokenizer: str = ""
    device: str = "auto"
    device_index: Numbers = (0,)
    # CTranslate2 picks the fastest type the device supports (int8 on a CPU that has it).
    compute_type: str = "auto"
    # 0 = derived from the cores (see derive_threads): two engine threads, so a job arriving
    # while a batch runs starts at once in a second batch (bench/join.py), sharing the cores.
    inter_threads: int = 0
    intra_threads: int = 0
    max_context_tokens: int = 4096
    max_batch_size: int = 32
    # Prompt texts many jobs start with (a chat's system prompt as the template renders it):
    # their prefill is run once and its state cached by CTranslate2 (worker/engine/prefix.py).
    static_prompts: tuple[str, ...] = ()
    # Common prefixes learned from traffic (prompts sharing at least prefix_min_tokens leading
    # tokens of one API key, or of one cache_salt), cached like static_prompts; the least
    # recently used go first. 0 = learn none.
    prefix_cache_entries: int = 8
    prefix_min_tokens: int = 64
    # The memory bound, in tokens (each costs 2 x layers x d_model values): the learned
    # prefixes together, and what CTranslate2 holds cached over the engine process's life
    # (configured prompts always). 0: only prefix_cache_entries bounds the table.
    prefix_cache_tokens: int = 16384
    # Unset: the model directory's tokenizer_config.json (add_bos_token), else True.
    add_bos: bool | None = None
    # Jinja template turning chat messages into a prompt; empty: tokenizer_config.json's
    # chat_template, else the plain built-in one (trickle/model_files.py).
    chat_template: str = ""
    # Token ids that end generation besides the tokenizer's end token; empty: those of the
    # directory's generation_config.json (eos_token_id).
    eos_token_ids: Numbers = ()
    # How the web tier finds tool calls in this model's answers (web/common/tools): "hermes" for
    # <tool_call>{"name": ..., "arguments": {...}}</tool_call> (what the built-in template asks
    # for), "json" for an answer that is the call object itself (or a list of them).
    tool_call_parser: Literal["hermes", "json"] = "hermes"
    # A template for requests with tools when the model's own cannot render them (it never
    # reads ``tools``): a Jinja string, or "builtin" for Trickle's. Empty: such requests are a 400.
    tool_chat_template: str = ""
    # What a request that leaves temperature, top_p, top_k, repetition_penalty or max_tokens
    # out gets from this model (trickle/config/sampling.py); unset: generation_config.json's.
    sampling: ModelSampling = field(default_factory=ModelSampling)
    # How the engine batches this model's jobs: timings measured on one machine, apart from
    # what a client sees (trickle/config/tuning.py).
    tuning: ModelTuning = field(default_factory=ModelTuning)

    def engine_lanes(self, shares_slots: bool) -> Lanes:
        """The engine's lanes by kind (trickle/config/lanes.py); ``shares_slots``: keys share
        the slots (``Settings.shares_slots``), so the spare lanes may be their reserve."""
        reserve = shares_slots and self.tuning.reserve_lane
        return Lanes(
            devices=max(len(self.device_index), 1),
            ordinary_per_device=max(self.inter_threads, 1),
            spare_per_device=1 if reserve else self.tuning.overflow_lanes_per_device,
            spare_use=SpareUse.RESERVE if reserve else SpareUse.OVERFLOW,
        )

    def with_threads(self, cores: int) -> ModelSettings:
        """These settings with engine threads left at 0 derived from ``cores``."""
        inter, intra = derive_threads(self.inter_threads, self.intra_threads, cores)
        return dataclasses.replace(self, inter_threads=inter, intra_threads=intra)

    @property
    def lanes(self) -> int:
        """Batches the engine runs at once: CTranslate2 makes ``inter_threads`` replicas per
        entry of ``device_index``, and the replicas on one device share one copy of the
        weights (and of the cached static prompts)."""
        return max(self.inter_threads, 1) * max(len(self.device_index), 1)


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def derive_threads(inter: int, intra: int, cores: int) -> tuple[int, int]:
    """Fill in engine threads left at 0: inter = min(2, cores), then intra = cores // inter.

    Two lanes keep one free for arrivals while a batch runs; inter x intra = cores keeps the
    engine from oversubscribing the machine. An explicit value is kept as it is.
    """
    inter = inter or min(2, max(cores, 1))
    intra = intra or max(1, cores // inter)
    return inter, intra
