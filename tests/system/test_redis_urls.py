"""Redis URLs with a password work end to end; rediss:// gets a certificate policy for Celery."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ops.redis_server import free_port, start_redis, stop_redis
from trickle import keys
from trickle.config.settings import Settings, settings_from_dict
from trickle.jobs import Job, new_job_id
from trickle.params import GenerationParams
from trickle.queue import enqueue_generation, make_celery
from trickle.store.job_store import JobStore

PASSWORD = "s3cret-pass"


@pytest.fixture(scope="module")
def protected_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    port = free_port()
    process = start_redis(
        port, tmp_path_factory.mktemp("redis-auth"), append_only=False, password=PASSWORD
    )
    yield port
    stop_redis(process)


def settings_for(url: str, demo_model_dir: Path) -> Settings:
    return settings_from_dict(
        {"redis": {"url": url}, "models": {"demo": {"path": str(demo_model_dir)}}}
    )


def test_password_url_reaches_store_and_queue(protected_port: int, demo_model_dir: Path) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{protected_port}/0"
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=protected_port).ping()  # the server really wants the password
    client = redis.Redis.from_url(url, decode_responses=True)
    store = JobStore(client, result_ttl_seconds=60, queued_ttl_seconds=60)
    job = Job(new_job_id(), "demo", "hi", GenerationParams(), created_at=time.time())
    store.create(job)
    assert store.get(job.id) is not None
    app = make_celery(settings_for(url, demo_model_dir), ["demo"])
    enqueue_generation(app, job.id, "demo")
    assert client.llen(keys.model_queue("demo")) == 1
    client.close()


def test_rediss_url_gets_certificate_verification(demo_model_dir: Path) -> None:
    import ssl

    app = make_celery(settings_for("rediss://:pw@cache.example:6380/0", demo_model_dir), ["demo"])
    assert app.conf.broker_use_ssl == {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    plain = make_celery(settings_for("redis://127.0.0.1:6399/0", demo_model_dir), ["demo"])
    assert not plain.conf.broker_use_ssl
