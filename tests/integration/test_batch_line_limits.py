"""A batch line is a request body: the interactive limits hold for it (audit hole 2).

The probe: a file of one 60 MB line, then ``POST /v1/batches``, froze the web process (the
line read whole, its prompt tokenized whole before the length check). Now a line past
``web.max_body_bytes`` fails alone with the 413 the same body would get, read a bounded piece at
a time, and a prompt longer than the limit is refused naming the prompt."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient

from tests.file_batches import FIRST, SECOND, bearer, create, job_ids_of, jsonl, line, upload
from trickle import keys
from trickle.config.sections import AuthSettings, FileSettings
from trickle.config.settings import Settings
from trickle.tenants import digest_of_entry
from web.batches import file_store

MAX_BODY = 8192


@pytest.fixture(scope="module")
def line_settings(settings: Settings) -> Settings:
    bound = dataclasses.replace(settings.models["late"], name="bound")
    return dataclasses.replace(
        settings,
        web=dataclasses.replace(settings.web, max_body_bytes=MAX_BODY),
        files=FileSettings(max_file_bytes=400_000, max_bytes_per_key=800_000),
        models={**settings.models, "bound": bound},
        auth=AuthSettings((FIRST, SECOND)),
    )


@pytest.fixture
def client(
    line_settings: Settings, make_app: Callable[[Settings], Flask], redis_client: redis.Redis
) -> Iterator[FlaskClient]:
    owner = keys.files_of(digest_of_entry(FIRST))
    for file_id in redis_client.zrange(owner, 0, -1):
        redis_client.delete(keys.file(str(file_id)), keys.file_chunks(str(file_id)))
    held = [keys.files_held(digest_of_entry(FIRST)), keys.files_held_bytes(digest_of_entry(FIRST))]
    redis_client.delete(owner, *held)
    yield make_app(line_settings).test_client()


def test_a_file_line_past_the_body_limit_fails_alone_never_read_whole(
    client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    held: list[int] = []
    original = file_store.lines_of

    def watched(*args: object, **kwargs: object) -> Iterator[tuple[int, bytes]]:
        for end, found in original(*args, **kwargs):  # type: ignore[arg-type]
            held.append(len(found))
            yield end, found

    monkeypatch.setattr("web.batches.unread.lines_of", watched)  # counting the lines
    monkeypatch.setattr("web.batches.file_store.lines_of", watched)  # reading them
    huge = line("big", messages=[{"role": "user", "content": "word " * 50_000}])
    data = jsonl(line("a"), huge, line("b"))
    assert len(data) > 30 * MAX_BODY
    file_id = upload(client, data).get_json()["id"]
    created = create(client, file_id)
    assert created.status_code == 200, created.get_data(as_text=True)
    batch = created.get_json()
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 1}
    assert max(held) <= MAX_BODY + 1  # the big line never sat whole in the process
    assert len(job_ids_of(client.application, batch["id"])) == 2


def test_a_jsonl_line_past_the_body_limit_is_413_naming_it(client: FlaskClient) -> None:
    huge = line("big", url="/v1/completions", prompt="word " * 4000)
    body = jsonl(line("a", url="/v1/completions"), huge)
    refused = client.post("/v1/batches", data=body, headers=bearer(FIRST))
    assert refused.status_code == 413, refused.get_data(as_text=True)
    error = refused.get_json()["error"]
    assert error["param"] == "line 2" and "web.max_body_bytes" in error["message"]


def test_a_long_prompt_within_the_body_is_refused_naming_the_prompt(client: FlaskClient) -> None:
    body = {"model": "bound", "prompt": "word " * 1600, "max_tokens": 2}  # 8,000 characters
    refused = client.post("/v1/completions", json=body, headers=bearer(FIRST))
    assert refused.status_code == 400
    assert refused.get_json()["error"]["param"] == "prompt"
