"""The metrics Trickle exports: names, help, label names and histogram buckets.

Shared contract: workers record into Redis (``telemetry.metrics``), the web tier exposes them in
Prometheus text format at /metrics (``web.operations.metrics``). Names follow the ecosystem (vLLM,
TGI).
"""

from __future__ import annotations

from dataclasses import dataclass

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class Histogram:
    name: str
    help: str
    buckets: tuple[float, ...]


@dataclass(frozen=True)
class Counter:
    name: str
    help: str


TIME_TO_FIRST_TOKEN = Histogram(
    "trickle_time_to_first_token_seconds",
    "Time from submission to the first token, per job.",
    LATENCY_BUCKETS,
)
QUEUE_TIME = Histogram(
    "trickle_queue_time_seconds",
    "Time from submission to a worker starting the job.",
    LATENCY_BUCKETS,
)
INTER_TOKEN_LATENCY = Histogram(
    "trickle_inter_token_latency_seconds",
    "Mean time between consecutive tokens, observed once per job.",
    TOKEN_LATENCY_BUCKETS,
)
E2E_LATENCY = Histogram(
    "trickle_e2e_request_latency_seconds",
    "Time from submission to the stored result, per job.",
    LATENCY_BUCKETS,
)
BATCH_SIZE = Histogram(
    "trickle_batch_size", "Jobs per CTranslate2 generate_batch call.", BATCH_BUCKETS
)
COLD_START = Histogram(
    "trickle_cold_start_seconds",
    "Worker process start to its first claimed job; phase: total, model_load or rest.",
    (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0, 120.0),
)
# The hops before the first token (trickle.hop_timings) add up to TIME_TO_FIRST_TOKEN: the one
# whose p99 grew is the one that broke the budget (deploy/prometheus/rules.yml).
HOP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
HOP_TIME = Histogram(
    "trickle_hop_seconds",
    "Time a job spent in each hop; hop: admit, queue, claim, prefill or generate.",
    HOP_BUCKETS,
)
HISTOGRAMS = (
    TIME_TO_FIRST_TOKEN,
    HOP_TIME,
    QUEUE_TIME,
    INTER_TOKEN_LATENCY,
    E2E_LATENCY,
    BATCH_SIZE,
    COLD_START,
)

JOBS = Counter("trickle_jobs_total", "Jobs that reached a final status, by model and status.")
TOKENS = Counter("trickle_tokens_generated_total", "Tokens generated, by model.")
PREFIX_CACHE_HITS = Counter(
    "trickle_prefix_cache_hits_total",
    "Jobs whose shared prefix (a system prompt) was already cached: its prefill was skipped.",
)
PREFIX_CACHE_MISSES = Counter(
    "trickle_prefix_cache_misses_total",
    "Jobs with a shared prefix that was not cached yet: their batch prefilled and cached it.",
)
ENGINE_RESTARTS = Counter(
    "trickle_engine_restarts_total",
    "Running batches restarted, by model and kind: join (newcomers joined it) or split "
    "(half of it moved to an idle lane).",
)
# Usage per key (its tenant name: a table's, key-<12 hex> for [auth] api_keys, "default" for
# anonymous callers), counted
# when a worker ends the job: jobs by status, the prompt's tokens and the completion's.
KEY_JOBS = Counter("trickle_key_jobs_total", "Jobs a worker ended, by key name, model and status.")
KEY_PROMPT_TOKENS = Counter(
    "trickle_key_prompt_tokens_total", "Prompt tokens of ended jobs, by key name and model."
)
KEY_COMPLETION_TOKENS = Counter(
    "trickle_key_completion_tokens_total", "Tokens generated, by key name and model."
)
COUNTERS = (
    JOBS,
    TOKENS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_MISSES,
    ENGINE_RESTARTS,
    KEY_JOBS,
    KEY_PROMPT_TOKENS,
    KEY_COMPLETION_TOKENS,
)
