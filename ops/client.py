"""A small HTTP client for Trickle's API (standard library only), used by the `trickle` CLI."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


class ApiError(RuntimeError):
    """The server answered with an error; the message is its JSON error message."""

    def __init__(self, status: int, body: str):
        try:
            error = json.loads(body)["error"]
            message = error["message"] + (
                f" (param: {error['param']})" if error.get("param") else ""
            )
        except (ValueError, KeyError, TypeError):
            message = body[:200]
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class SseEvent:
    event: str
    data: str
    id: str | None = None


class TrickleClient:
    def __init__(self, base_url: str, api_key: str = "", timeout: float = 120.0):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    def submit_job(self, body: dict[str, Any], wait: float = 0) -> dict[str, Any]:
        headers = {"Prefer": f"wait={wait:g}"} if wait else {}
        return self._json("POST", "/v1/jobs", body, headers)

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/jobs/{job_id}")

    def events(self, job_id: str) -> Iterator[SseEvent]:
        """The job's SSE stream, event by event, until ``done`` (or ``error``)."""
        request = self._request("GET", f"/v1/jobs/{job_id}/events", None, {})
        with self._open(request) as response:
            fields: dict[str, str] = {}
            for raw in response:
                line = raw.decode("utf-8").rstrip("\r\n")
                if line.startswith(":"):
                    continue
                if line:
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")
                    continue
                if "event" in fields:
                    event = SseEvent(fields["event"], fields.get("data", ""), fields.get("id"))
                    yield event
                    if event.event in ("done", "error"):
                        return
                fields = {}

    def create_batch(self, jsonl: bytes) -> dict[str, Any]:
        boundary = uuid.uuid4().hex
        body = (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                f'filename="input.jsonl"\r\nContent-Type: application/jsonl\r\n\r\n'
            ).encode()
            + jsonl
            + f"\r\n--{boundary}--\r\n".encode()
        )
        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        return self._json("POST", "/v1/batches", body, headers)

    def get_batch(self, batch_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/batches/{batch_id}")

    def batch_output(self, batch_id: str) -> str:
        with self._open(self._request("GET", f"/v1/batches/{batch_id}/output", None, {})) as r:
            return str(r.read().decode("utf-8"))

    def _json(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        with self._open(self._request(method, path, body, headers or {})) as response:
            result: dict[str, Any] = json.loads(response.read())
            return result

    def _request(
        self, method: str, path: str, body: Any, headers: dict[str, str]
    ) -> urllib.request.Request:
        data = None
        if isinstance(body, bytes):
            data = body
        elif body is not None:
            data = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **headers}
        if self.api_key:
            headers = {"Authorization": f"Bearer {self.api_key}", **headers}
        return urllib.request.Request(
            self.base_url + path, data=data, headers=headers, method=method
        )

    def _open(self, request: urllib.request.Request) -> Any:
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, exc.read().decode("utf-8", "replace")) from None
