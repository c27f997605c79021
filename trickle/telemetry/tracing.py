"""OpenTelemetry tracing: one trace per job, from the POST to the first token a reader gets.

Off unless an OTLP endpoint is configured the standard way (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, OTLP over HTTP/protobuf); ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` turn it off again. The SDK itself reads the other standard
variables (``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``...). When off, nothing
of the SDK is imported and every call here returns at its first line.

Hops run in three processes, so the trace travels with the job: the web tier stores the
submitting request's W3C ``traceparent`` in the job hash, and the worker and the stream views
record their spans under it. The worker records its spans when the job ends, with the
timestamps it took on the way (``JobTimeline``), so tracing adds no work to the token path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _traceparent_of(span: Any) -> str:
    """The W3C traceparent naming ``span`` (what a child in another process is recorded under)."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


@dataclass
class JobTimeline:
    """Wall-clock moments (unix seconds) a worker notes for one attempt at a job."""

    claim_started: float = 0.0
    claimed: float = 0.0
    scheduled: float | None = None
    batch_started: float | None = None
    first_token: float | None = None
    first_published: float | None = None
    last_token: float | None = None


class RequestTrace:
    """The server span of one HTTP request, with child spans for its hops."""

    def __init__(self, tracer: Any, span: Any):
        self._tracer = tracer
        self._span = span

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        if self._span is None:
            yield
            return
        from opentelemetry import trace

        context = trace.set_span_in_context(self._span)
        with self._tracer.start_as_current_span(name, context=context):
            yield

    @property
    def traceparent(self) -> str:
        return "" if self._span is None else _traceparent_of(self._span)


NO_TRACE = RequestTrace(None, None)


class Tracing:
    """One per process; ``Tracing.disabled()`` when no endpoint is configured."""

    def __init__(self, provider: Any = None):
        self._provider = provider
        self._tracer = provider.get_tracer("trickle") if provider is not None else None

    @classmethod
    def disabled(cls) -> Tracing:
        return cls()

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], service_name: str) -> Tracing:
        """Tracing as the standard OTEL_* variables ask (``service_name`` unless they name one)."""
        if not any(environ.get(name) for name in ENDPOINT_VARIABLES):
            return cls.disabled()
        if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return cls.disabled()
        if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
            return cls.disabled()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        # Also reads OTEL_RESOURCE_ATTRIBUTES; OTEL_SERVICE_NAME, when set, names the service.
        name = environ.get("OTEL_SERVICE_NAME") or service_name
        resource = Resource.create({"service.name": name})
        provider = TracerProvider(resource=resource)  # reads OTEL_TRACES_SAMPLER
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        return cls(provider)

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def request(self, name: str) -> contextlib.AbstractContextManager[RequestTrace]:
        """A server span around a request handler (a no-op context when tracing is off)."""
        if self._tracer is None:
            return contextlib.nullcontext(NO_TRACE)
        return self._request(name)

    @contextlib.contextmanager
    def _request(self, name: str) -> Iterator[RequestTrace]:
        from opentelemetry.trace import SpanKind

        tracer = self._tracer
        assert tracer is not None  # request() checked
        with tracer.start_as_current_span(name, kind=SpanKind.SERVER) as span:
            yield RequestTrace(tracer, span)

    def record(
        self,
        traceparent: str,
        name: str,
        start: float,
        end: float,
        attributes: Mapping[str, Any] | None = None,
    ) -> str:
        """A finished span under ``traceparent``, with explicit times; returns its own
        traceparent (for children), or "" when off or the job is untraced."""
        if self._tracer is None or not traceparent:
            return ""
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
        span = self._tracer.start_span(
            name, context=parent, start_time=_ns(start), attributes=dict(attributes or {})
        )
        span.end(end_time=_ns(max(end, start)))
        return _traceparent_of(span)

    def shutdown(self) -> None:
        """Export what is still buffered (on process exit)."""
        if self._provider is not None:
            self._provider.shutdown()
