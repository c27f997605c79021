"""A batch's refused lines keep only what the output file says of them (``custom_id`` and the
error), never the request: an in-process app on the test Redis, whose stored items are read."""

from __future__ import annotations

import json
from collections.abc import Callable

import redis
from flask import Flask

from tests.clients import batch_line, jsonl
from tests.file_batches import read_in
from trickle import keys
from trickle.config.settings import Settings
from web.batches.store import MAX_ERROR_MESSAGE_CHARS

LONG_PROMPT = "The socket " * 5_000  # 55 KB: within the body limit, far over 256 tokens


def test_refused_lines_store_their_error_not_their_prompt(
    settings: Settings, make_app: Callable[[Settings], Flask], redis_client: redis.Redis
) -> None:
    client = make_app(settings).test_client()
    lines = [batch_line(f"long-{i}", prompt=LONG_PROMPT) for i in range(4)]
    lines.append(batch_line("named", model="m" * 50_000))  # its error quotes the name
    lines.append(batch_line("fine", model="late", prompt="Hi"))  # no worker: stays queued
    body = jsonl(lines)
    response = read_in(client, client.post("/v1/batches", data=body))
    assert response.status_code == 200, response.get_json()
    batch = response.get_json()
    assert batch["request_counts"]["failed"] == 5

    stored = redis_client.lrange(keys.batch_items(batch["id"]), 0, -1)
    assert len(stored) == 6
    refused = [json.loads(entry) for entry in stored[:5]]
    for entry in refused:
        # output_hold: the exact bytes of its error line, held against the key's storage
        assert set(entry) == {"custom_id", "url", "error_status", "error", "output_hold"}, entry
        assert len(entry["error"]["message"]) <= MAX_ERROR_MESSAGE_CHARS + 3
    total = sum(len(entry) for entry in stored)
    assert total < 5_000 < len(body) // 50, total  # the input was about 270 KB
    assert "The socket The socket" not in "".join(stored)

    output = client.get(f"/v1/batches/{batch['id']}/output").get_data(as_text=True)
    by_id = {line["custom_id"]: line for line in map(json.loads, output.splitlines())}
    assert set(by_id) == {"long-0", "long-1", "long-2", "long-3", "named"}
    for custom_id in ("long-0", "named"):
        line = by_id[custom_id]
        assert line["response"]["status_code"] in (400, 404)
        assert line["error"]["code"] and line["error"]["message"]
        assert line["response"]["body"]["error"]["param"]
    client.post(f"/v1/batches/{batch['id']}/cancel")  # the queued line's job goes away
