"""One streamed request per API, timed at the client: each text-carrying write's arrival,
its first token (TTFT) and the tokens it received, and whether it met the SLO.

The APIs: OpenAI streaming chat completions, streamed Anthropic messages, and jobs (``POST
/v1/jobs`` then the job's SSE stream, or its WebSocket), all over ``keepalive.Connections``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from bench.harness import models
from bench.harness.keepalive import Connections, exchange
from bench.harness.ws import follow_job_ws

SLO_TTFT_MS = 250.0
SLO_ITL_MS = 50.0


@dataclass
class RequestResult:
    ok: bool
    error: str = ""
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    arrivals: list[float] = field(default_factory=list)  # of each write that carried text
    tokens: int = 0  # tokens received (a write may carry several)

    @property
    def itls_s(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]

    def meets_slo(self) -> bool:
        return (
            self.ok
            and self.ttft_s * 1000 <= SLO_TTFT_MS
            and all(gap * 1000 <= SLO_ITL_MS for gap in self.itls_s)
        )


async def openai_request(conns: Connections, model: str, max_tokens: int) -> RequestResult:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": models.PROMPT}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 1.0,
        "ignore_eos": True,  # a top-level field, as vLLM takes it
    }
    start = time.perf_counter()
    status, lines = await exchange(conns, "POST", "/v1/chat/completions", body)
    result = RequestResult(ok=status == 200)
    async for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            result.ok, result.error = False, json.dumps(chunk["error"])[:200]
            continue
        if chunk.get("usage"):
            result.tokens = chunk["usage"]["completion_tokens"]
        choices = chunk.get("choices") or [{}]
        if choices[0].get("delta", {}).get("content"):
            result.arrivals.append(time.perf_counter())
    return _finished(result, start, status)


async def messages_request(conns: Connections, model: str, max_tokens: int) -> RequestResult:
    """A streamed Anthropic message (no ignore_eos there: a stream may end before max_tokens,
    and its tokens are what message_delta's usage counts)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": models.PROMPT}],
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 1.0,
    }
    start = time.perf_counter()
    status, lines = await exchange(conns, "POST", "/v1/messages", body)
    result = RequestResult(ok=status == 200)
    async for line in lines:
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        if event["type"] == "content_block_delta" and event["delta"]["text"]:
            result.arrivals.append(time.perf_counter())
        elif event["type"] == "message_delta":
            result.tokens = event["usage"]["output_tokens"]
        elif event["type"] == "error":
            result.ok, result.error = False, json.dumps(event["error"])[:200]
    return _finished(result, start, status)


async def job_request(
    conns: Connections, model: str, max_tokens: int, over_websocket: bool = False
) -> RequestResult:
    """``POST /v1/jobs``, then the job's SSE stream (its WebSocket with ``over_websocket``)."""
    body = {"model": model, "prompt": models.PROMPT, "max_tokens": max_tokens, "ignore_eos": True}
    start = time.perf_counter()
    status, lines = await exchange(conns, "POST", "/v1/jobs", body)
    text = "".join([line async for line in lines])
    if status != 202:
        return RequestResult(False, f"POST {status}: {text[:200]}")
    job_id = json.loads(text)["id"]
    if over_websocket:
        arrivals, tokens, final = await follow_job_ws(conns.port, job_id)
        result = RequestResult(ok=final == "succeeded", arrivals=arrivals, tokens=tokens)
        result.error = "" if result.ok else f"job {final}"
        return _finished(result, start, 101)
    status, lines = await exchange(conns, "GET", f"/v1/jobs/{job_id}/events", None)
    result = RequestResult(ok=status == 200)
    event = ""
    async for line in lines:
        if line.startswith("event: "):
            event = line[7:].strip()
        elif line.startswith("data: ") and event == "token":
            result.tokens += 1
            if json.loads(line[6:])["text"]:
                result.arrivals.append(time.perf_counter())
        elif line.startswith("data: ") and event == "done":
            job = json.loads(line[6:])
            if job["status"] != "succeeded":
                result.ok, result.error = False, f"job {job['status']}"
    return _finished(result, start, status)


async def ws_request(conns: Connections, model: str, max_tokens: int) -> RequestResult:
    return await job_request(conns, model, max_tokens, over_websocket=True)


Sender = Callable[[Connections, str, int], Coroutine[Any, Any, RequestResult]]


def sender(api: str) -> Sender:
    """The client of one API: ``openai`` (streamed chat), ``messages`` (a streamed Anthropic
    message), ``ws`` (a job over WebSocket), or anything else: a job over SSE."""
    senders = {"openai": openai_request, "messages": messages_request, "ws": ws_request}
    return senders.get(api, job_request)


def _finished(result: RequestResult, start: float, status: int) -> RequestResult:
    if not result.arrivals:
        result.ok = False
        result.error = result.error or f"status {status}, no tokens"
        return result
    result.ttft_s = result.arrivals[0] - start
    result.e2e_s = result.arrivals[-1] - start
    return result
