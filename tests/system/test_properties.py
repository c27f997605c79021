"""Property tests (Hypothesis) on the real stack: whatever the body (nesting, numbers, unicode,
framing, Content-Type) and whenever a reader leaves, no 5xx, no HTML, no tracebacks, and the
open-streams gauge returns to its baseline.

Example counts are small and derandomized: the suite runs on two shared cores, and a failure
must reproduce. For a deeper local run, raise the counts in ``examples(...)``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests
import websocket
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.clients import submit
from tests.server_log import server_faults
from tests.system.test_robustness import active_streams, raw_http, settle_streams


def examples(count: int) -> Any:
    return settings(
        max_examples=count,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


FIELDS = [
    "prompt", "model", "max_tokens", "temperature", "top_k", "top_p", "stop", "seed", "n",
    "ignore_eos", "repetition_penalty", "webhook_url", "messages", "stream", "stream_options",
    "logprobs", "echo", "custom_id", "method", "url", "body", "role", "content",
]  # fmt: skip
NASTY = ["\ud800", "\udfff", "\u2028", "\u2029", "\x85", "\x00", "\r", "\n", "é", "😀", "\ufeff"]
characters = st.one_of(st.characters(exclude_categories=()), st.sampled_from(NASTY))
texts = st.text(characters, max_size=12)
numbers = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 2**63, 2**64, 1e308, 5e-324]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(FIELDS), texts), inner, max_size=5),
    ),
    max_leaves=16,
)


@st.composite
def documents(draw: st.DrawFn) -> bytes:
    """JSON-ish bytes: a random value, maybe buried deep, maybe broken, maybe a huge number."""
    text = json.dumps(draw(values))  # NaN, Infinity and lone surrogates (escaped) included
    shape = draw(st.sampled_from(["plain", "nested", "huge_number", "truncated", "bytes"]))
    if shape == "nested":
        depth = draw(st.integers(1, 3000))
        text = "[" * depth + text + "]" * draw(st.sampled_from([depth, 0, depth - 1]))
    elif shape == "huge_number":
        text = json.dumps({"prompt": "x", "seed": 0}).replace(
            "0}", "9" * draw(st.integers(1, 6000)) + "}"
        )
    elif shape == "truncated":
        text = text[: draw(st.integers(0, len(text)))]
    elif shape == "bytes":
        return draw(st.binary(max_size=64))
    return text.encode("utf-8", "surrogatepass")


def chunks(data: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


CONTENT_TYPES = [
    None,
    "application/json",
    "application/jsonl",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=xyz",
]


def assert_json_error_or_success(response: requests.Response) -> None:
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        assert response.headers["Content-Type"].startswith("application/json"), response.text[:200]
        assert response.json()["error"]["message"]


@pytest.fixture(scope="module")
def baseline(stack_url: str) -> float:
    return active_streams(stack_url)


@pytest.fixture(scope="module")
def log_start(stack_url: str, log_dir: Path) -> int:
    """Where the web log stood before these properties ran."""
    return (log_dir / "web.log").stat().st_size


@examples(100)
@given(
    route=st.sampled_from(["/v1/jobs", "/v1/completions", "/v1/chat/completions", "/v1/batches"]),
    document=documents(),
    framing=st.sampled_from(["length", "chunked", "lying_chunks"]),
    chunk_size=st.integers(1, 4096),
    content_type=st.sampled_from(CONTENT_TYPES),
)
def test_any_body_on_any_route_is_never_a_5xx(
    stack_url: str,
    baseline: float,
    log_start: int,
    route: str,
    document: bytes,
    framing: str,
    chunk_size: int,
    content_type: str | None,
) -> None:
    if route == "/v1/batches":  # the same document as a JSONL line, and as a line's body
        line = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": '
        document = document + b"\n" + line + document + b"}\n"
    headers = {"Content-Type": content_type} if content_type else {}
    if framing == "lying_chunks":  # each chunk one byte longer than its size line says
        head = f"POST {route} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        framed = b"".join(
            f"{len(part) - 1:x}\r\n".encode() + part + b"\r\n"
            for part in chunks(document + b" ", chunk_size)
        )
        status, response_headers, body = raw_http(
            stack_url, head.encode() + b"\r\n" + framed + b"0\r\n\r\n"
        )
        assert status < 500, body[:300]
        assert response_headers["Content-Type"].startswith("application/json")
        return
    data: Any = chunks(document, chunk_size) if framing == "chunked" else document
    response = requests.post(f"{stack_url}{route}", data=data, headers=headers, timeout=120)
    assert_json_error_or_success(response)


@pytest.fixture(scope="module")
def real_job_id(stack_url: str) -> str:
    return str(submit(stack_url, {"prompt": "The", "max_tokens": 2})["id"])


@examples(40)
@given(
    data=st.data(),
    path=st.sampled_from(
        [
            "/v1/jobs/{}",
            "/v1/jobs/{}/events",
            "/v1/jobs/{}/cancel",
            "/v1/batches/{}",
            "/v1/batches/{}/output",
            "/v1/batches/{}/cancel",
            "/v1/models/{}",
        ]
    ),
    after=st.one_of(st.none(), texts, st.integers(-(10**30), 10**30).map(str)),
)
def test_any_id_on_any_route_is_a_json_4xx(
    stack_url: str, real_job_id: str, data: st.DataObject, path: str, after: str | None
) -> None:
    """Random text, and a real job id with a key suffix (``<id>:tokens`` named a list)."""
    suffixed = st.sampled_from([":tokens", ":lease", ":x", "/", "%00"]).map(real_job_id.__add__)
    job_id = data.draw(st.one_of(texts, suffixed).filter(bool))
    safe = quote(job_id.encode("utf-8", "surrogatepass"), safe="")
    url = stack_url + path.format(safe)
    method = requests.post if path.endswith("/cancel") else requests.get
    params = {"after": after} if after is not None else None
    response = method(url, params=params, timeout=30)
    assert_json_error_or_success(response)
    assert response.status_code in (400, 404, 405), response.text[:200]


@examples(25)
@given(after=st.one_of(texts, st.integers(-(10**30), 10**30).map(str)))
def test_any_websocket_resume_point_is_an_event_never_http(
    stack_url: str, real_job_id: str, after: str
) -> None:
    """After the upgrade a bad ``after`` is an error event and close code 4400, not HTTP bytes."""
    query = quote(after.encode("utf-8", "surrogatepass"), safe="")
    ws = websocket.create_connection(
        stack_url.replace("http://", "ws://") + f"/v1/jobs/{real_job_id}/ws?after={query}",
        timeout=30,
    )
    try:
        message = json.loads(ws.recv())
        if message["event"] == "error":
            assert message["error"]["param"] == "after"
            opcode, frame = ws.recv_data(control_frame=True)
            assert opcode == websocket.ABNF.OPCODE_CLOSE
            assert int.from_bytes(frame[:2], "big") == 4400
        else:
            assert message["event"] in ("status", "token", "done")
    finally:
        ws.shutdown()


@examples(12)
@given(
    reader=st.sampled_from(["sse", "ws", "openai"]),
    take=st.integers(0, 30),
    linger=st.floats(0, 0.2),
    polite=st.booleans(),
)
def test_readers_leaving_at_any_moment_leave_nothing_behind(
    stack_url: str, baseline: float, reader: str, take: int, linger: float, polite: bool
) -> None:
    body = {"prompt": "The", "max_tokens": 400, "ignore_eos": True}
    if reader == "openai":
        response = requests.post(
            f"{stack_url}/v1/completions",
            json={**body, "model": "demo", "prompt": ["The", "A"], "stream": True},
            stream=True,
            timeout=30,
        )
        lines = response.iter_lines()
        for _ in range(take):
            if next(lines, None) is None:
                break
        time.sleep(linger)
        response.close()
    elif reader == "sse":
        job = submit(stack_url, body)
        response = requests.get(f"{stack_url}/v1/jobs/{job['id']}/events", stream=True, timeout=30)
        lines = response.iter_lines()
        for _ in range(take):
            if next(lines, None) is None:
                break
        time.sleep(linger)
        response.close()
    else:
        job = submit(stack_url, body)
        ws = websocket.create_connection(
            stack_url.replace("http://", "ws://") + f"/v1/jobs/{job['id']}/ws", timeout=30
        )
        try:
            for _ in range(take):
                if json.loads(ws.recv())["event"] not in ("status", "token"):
                    break
            time.sleep(linger)
        except websocket.WebSocketConnectionClosedException:
            pass
        if polite:
            ws.close()
        else:
            ws.shutdown()
    assert settle_streams(stack_url, baseline, timeout=15) == baseline


def test_the_fuzzing_left_no_traceback_and_no_stream(
    stack_url: str, baseline: float, log_dir: Path, log_start: int
) -> None:
    """Runs after the properties above (file order): they wrote no traceback and no 500."""
    assert settle_streams(stack_url, baseline) == baseline
    with (log_dir / "web.log").open("rb") as fh:
        fh.seek(log_start)
        written = fh.read().decode("utf-8", "replace")
    assert server_faults(written) == []
    assert '" 500 ' not in written
