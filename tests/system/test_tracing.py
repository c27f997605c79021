"""OpenTelemetry: one trace per job, exported over real OTLP/HTTP to a receiver the test runs.

The stack (own Redis, a real Celery worker, gunicorn) exports to ``tests.otlp_sink``, which
decodes the protobuf as a collector would; the test then walks the trace from the POST to the
first SSE write. Tracing off is covered by every other test (no endpoint configured).
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests

from ops.redis_server import free_port
from tests import stack
from tests.clients import read_sse
from tests.otlp_sink import ReceivedSpan, SpanSink
from trickle.telemetry.tracing import Tracing

WORKER_HOPS = {"queue wait", "claim", "batch wait", "first step", "first publish", "generate"}


@pytest.fixture(scope="module")
def sink() -> Iterator[SpanSink]:
    receiver = SpanSink()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def traced_url(
    sink: SpanSink,
    private_redis: redis.Redis,
    demo_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    port = private_redis.connection_pool.connection_kwargs["port"]
    work = tmp_path_factory.mktemp("traced")
    config = work / "traced.toml"
    config.write_text(
        f'[redis]\nurl = "redis://127.0.0.1:{port}/0"\n'
        f'[models.demo]\npath = "{demo_model_dir}"\nmax_batch_size = 4\n'
    )
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_SERVICE_NAME": "",  # the defaults name each tier
    }
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(
            stack.start_worker(
                config, f"redis://127.0.0.1:{port}/0", "traced", work, extra_env=otel
            )
        )
        web_port = free_port()
        processes.append(stack.start_web(config, web_port, work, extra_env=otel, name="web"))
        yield f"http://127.0.0.1:{web_port}"
    finally:
        for process in processes:
            stack.stop(process)


def _trace(spans: list[ReceivedSpan], trace_id: str) -> dict[str, ReceivedSpan]:
    return {span.name: span for span in spans if span.trace_id == trace_id}


def test_a_job_is_one_trace_from_post_to_first_delivery(sink: SpanSink, traced_url: str) -> None:
    response = requests.post(
        f"{traced_url}/v1/jobs",
        json={"prompt": "The socket module", "max_tokens": 12, "ignore_eos": True},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    streamed = read_sse(traced_url, job_id)
    assert len(streamed.tokens) == 12

    def post_span() -> ReceivedSpan | None:
        return next(
            (
                s
                for s in sink.spans()
                if s.name == "POST /v1/jobs"
                and any(
                    o.trace_id == s.trace_id and o.attributes.get("gen_ai.request.id") == job_id
                    for o in sink.spans()
                )
            ),
            None,
        )

    def complete(spans: list[ReceivedSpan]) -> bool:
        post = post_span()
        if post is None:
            return False
        names = set(_trace(spans, post.trace_id))
        return {"validate", "enqueue", "llm_request", "first delivery"} | WORKER_HOPS <= names

    spans = sink.wait_for(complete, timeout=30)
    post = post_span()
    assert post is not None
    trace = _trace(spans, post.trace_id)
    # Every hop hangs under the request: web children directly, worker hops under llm_request.
    for name in ("validate", "enqueue", "first delivery", "llm_request"):
        assert trace[name].parent_span_id == post.span_id, name
    for name in WORKER_HOPS:
        assert trace[name].parent_span_id == trace["llm_request"].span_id, name
    assert post.service == "trickle-web"
    assert trace["llm_request"].service == "trickle-worker"
    assert trace["first delivery"].attributes["trickle.transport"] == "sse"
    # The hops follow each other in time (one clock: the same machine).
    order = ["queue wait", "claim", "batch wait", "first step", "first publish"]
    for earlier, later in itertools.pairwise(order):
        assert trace[earlier].end_ns <= trace[later].start_ns + 1_000_000, (earlier, later)
    # A reader can get the token before the publisher thread notes Redis's reply, so the
    # delivery is only ordered after the token's existence, not after the publish span's end.
    assert trace["first step"].end_ns <= trace["first delivery"].end_ns
    # vLLM-style latency attributes, consistent with the hops.
    attributes = trace["llm_request"].attributes
    assert attributes["gen_ai.usage.completion_tokens"] == 12
    assert attributes["gen_ai.response.model"] == "demo"
    ttft = attributes["gen_ai.latency.time_to_first_token"]
    queued = attributes["gen_ai.latency.time_in_queue"]
    assert 0 <= queued <= ttft <= attributes["gen_ai.latency.e2e"]
    assert abs(queued - trace["queue wait"].seconds) < 1e-3


def test_tracing_is_off_without_an_endpoint() -> None:
    assert not Tracing.from_environment({}, "x").enabled
    assert not Tracing.from_environment(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}, "x"
    ).enabled
    on = Tracing.from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, "x")
    assert on.enabled
    on.shutdown()
    # Off, the request context hands out a trace whose steps and context cost nothing.
    with Tracing.disabled().request("POST /v1/jobs") as trace:
        with trace.step("validate"):
            pass
        assert trace.traceparent == ""
    assert Tracing.disabled().record("00-" + "1" * 32 + "-" + "2" * 16 + "-01", "x", 0, 1) == ""
