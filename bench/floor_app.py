"""The plainest Flask + Celery + Redis service that does what a streamed one-token job needs.

Not Trickle: the floor under its per-request goals (``bench.floor`` serves this with gunicorn's
gevent worker, as Trickle's web tier is served, and runs a stock Celery worker on it). A POST
writes a record and sends a Celery task (stock kombu, acks late); the task publishes its tokens
(the body's ``max_tokens``, default 1, each its own message, ``token_gap_ms`` apart), writes the
result and publishes the end; the stream subscribes (one shared pub/sub connection and a
listener thread, as a careful minimal design has), reads the record, and relays what arrives.
No validation, tokenizer, engine, leases, replay log, limits or keys. A POST with ``Prefer:
wait`` follows the job's channel before it sends the task, and answers with the stored record
once the end arrives. ``FLOOR_MODE=bare``: the requests alone, answering at once (gunicorn and
Flask's share).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import redis
from celery import Celery
from flask import Flask, Response, jsonify, request

REDIS_URL = os.environ.get("FLOOR_REDIS_URL", "redis://127.0.0.1:6379/0")
BARE = os.environ.get("FLOOR_MODE", "stock") == "bare"

celery = Celery("floor", broker=REDIS_URL)
celery.conf.update(
    worker_prefetch_multiplier=4,
    task_acks_late=True,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    worker_disable_rate_limits=True,
    broker_transport_options={"visibility_timeout": 3600},
)
client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
app = Flask(__name__)


@celery.task(name="floor.generate")  # type: ignore[untyped-decorator]
def generate(job_id: str, tokens: int = 1, gap_ms: float = 0.0) -> None:
    """``tokens`` tokens, each its own message as a generation loop publishes them, ``gap_ms``
    apart (a decoding step's time); the result and the end with the last."""
    channel = f"floor:events:{job_id}"
    for _ in range(tokens - 1):
        client.publish(channel, "t s")
        if gap_ms:
            time.sleep(gap_ms / 1000)
    pipe = client.pipeline(transaction=False)
    pipe.hset(f"floor:{job_id}", mapping={"status": "succeeded", "output": "s" * tokens})
    pipe.publish(channel, "t s")
    pipe.publish(channel, "d")
    pipe.execute()


class Relay:
    """One pub/sub connection for the process; its listener hands messages to the streams."""

    def __init__(self) -> None:
        # Any: redis-py's typing of PubSub differs between releases (untyped before 8.2).
        self._pubsub: Any = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call,unused-ignore]
        self._pubsub.subscribe("floor:idle")
        self._streams: dict[str, queue.Queue[str]] = {}
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        for message in self._pubsub.listen():
            if message["type"] == "message":
                stream = self._streams.get(message["channel"].removeprefix("floor:events:"))
                if stream is not None:
                    stream.put(message["data"])

    def open(self, job_id: str) -> queue.Queue[str]:
        stream: queue.Queue[str] = queue.Queue()
        self._streams[job_id] = stream
        self._pubsub.subscribe(f"floor:events:{job_id}")
        return stream

    def close(self, job_id: str) -> None:
        self._streams.pop(job_id, None)
        self._pubsub.unsubscribe(f"floor:events:{job_id}")


relay = None if BARE else Relay()
BARE_STREAM = 'event: token\ndata: {"text": "s"}\n\nevent: done\ndata: {}\n\n'


@app.post("/v1/jobs")
def submit() -> Any:
    body = request.get_json()
    job_id = uuid.uuid4().hex
    waits = request.headers.get("Prefer", "").startswith("wait")
    if BARE:
        if waits:
            return jsonify({"id": job_id, "status": "succeeded", "output": "s"})
        return jsonify({"id": job_id, "status": "queued"}), 201
    assert relay is not None
    events = relay.open(job_id) if waits else None
    try:
        client.hset(f"floor:{job_id}", mapping={"status": "queued", "prompt": body["prompt"]})
        tokens, gap_ms = int(body.get("max_tokens", 1)), float(body.get("token_gap_ms", 0))
        celery.send_task("floor.generate", args=[job_id, tokens, gap_ms])
        if events is None:
            return jsonify({"id": job_id, "status": "queued"}), 201
        while events.get(timeout=30) != "d":
            pass
        status, output = client.hmget(f"floor:{job_id}", ["status", "output"])
        return jsonify({"id": job_id, "status": status, "output": output})
    finally:
        if events is not None:
            relay.close(job_id)


@app.get("/v1/jobs/<job_id>/stream")
def stream(job_id: str) -> Response:
    if relay is None:
        return Response(BARE_STREAM, mimetype="text/event-stream")
    events = relay.open(job_id)

    def body() -> Iterator[str]:
        try:
            status, output = client.hmget(f"floor:{job_id}", ["status", "output"])
            if status == "succeeded":
                yield f"event: token\ndata: {json.dumps({'text': output})}\n\n"
                yield "event: done\ndata: {}\n\n"
                return
            while (message := events.get(timeout=30)) != "d":
                yield f"event: token\ndata: {json.dumps({'text': message[2:]})}\n\n"
            yield "event: done\ndata: {}\n\n"
        finally:
            relay.close(job_id)

    return Response(body(), mimetype="text/event-stream")
