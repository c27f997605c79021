"""Stream URLs on a real gunicorn with API keys (configured through the environment, as an operator
would): a backend's URLs stream a whole job over SSE and WebSocket without the key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from ops.redis_server import free_port
from tests import stack
from tests.clients import poll_until_finished, read_sse, read_ws
from tests.integration.test_stream_access import AUTH, KEY, PAGE_ORIGIN


@pytest.fixture(scope="module")
def keyed_web(config_path: Path, log_dir: Path, stack_url: str) -> Iterator[tuple[str, Path]]:
    """A gunicorn with API keys and CORS set through the environment, on the shared worker."""
    port = free_port()
    env = {"TRICKLE_API_KEYS": KEY, "TRICKLE__WEB__CORS_ORIGINS": PAGE_ORIGIN}
    process = stack.start_web(config_path, port, log_dir, extra_env=env, name="web-tokens")
    yield f"http://127.0.0.1:{port}", log_dir / "web-tokens.log"
    stack.stop(process)


def test_a_backend_hands_out_urls_that_stream_everything_without_the_key(
    keyed_web: tuple[str, Path],
) -> None:
    url, log = keyed_web
    body = {"prompt": "The socket", "max_tokens": 80, "ignore_eos": True, "temperature": 0}
    response = requests.post(f"{url}/v1/jobs", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 202
    job = response.json()
    urls = job["urls"]
    assert urls["stream"].startswith(url)  # absolute, from the request's Host
    assert requests.get(f"{url}/v1/jobs/{job['id']}/events", timeout=10).status_code == 401

    stream = read_sse(url, job["id"], query="?" + urlsplit(urls["stream"]).query)
    final = poll_until_finished(url, job["id"], headers=AUTH)
    assert stream.done is not None and stream.text == final["output"]
    assert stream.indexes == list(range(80))
    assert [s["status"] for s in stream.statuses][-1] == "succeeded"
    resumed = read_sse(
        url, job["id"], headers={"Last-Event-ID": "69"}, query="?" + urlsplit(urls["ws"]).query
    )
    assert resumed.indexes == list(range(70, 80))
    ws = read_ws(url, job["id"], query="?" + urlsplit(urls["ws"]).query + "&after=9")
    assert ws.indexes == list(range(10, 80))
    assert final["output"].endswith("".join(t["text"] for t in ws.tokens))

    # A wrong token on the WebSocket is refused before the upgrade: a JSON 401, no stream.
    handshake = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    refused = requests.get(
        f"{url}/v1/jobs/{job['id']}/ws?token=1.wrong", headers=handshake, timeout=10
    )
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_stream_token"
    assert KEY not in log.read_text()  # never logged, and never in a URL to log
