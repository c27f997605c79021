"""The grace a keyed stream's jobs get when their client leaves (web/streams/hold.py): a job is
canceled only once no reader is attached and the last one left at least the grace ago. On the
test Redis, in process; the timers are not armed here (no unfinished jobs are handed over), the
expiry is called at chosen moments instead."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import pytest
from flask import Flask

from trickle.config.settings import Settings
from trickle.jobs import Job, JobStatus, new_job_id
from trickle.params import GenerationParams
from web.services import Services, services
from web.streams import hold as stream_hold

GRACE = 5.0


@pytest.fixture
def svc(settings: Settings, make_app: Callable[[Settings], Flask]) -> Services:
    web = dataclasses.replace(settings.web, stream_resume_grace_seconds=GRACE)
    return services(make_app(dataclasses.replace(settings, web=web)))


def stored_job(svc: Services) -> Job:
    job = Job(new_job_id(), "late", "x", GenerationParams(), created_at=time.time())
    svc.store.create(job)
    return job


def test_a_job_with_a_reader_attached_is_never_canceled(svc: Services) -> None:
    job = stored_job(svc)
    stream_hold.attach(svc, [job])  # the first request's stream
    stream_hold.attach(svc, [job])  # its retry, before the first one's drop was noticed
    stream_hold.detach(svc, [job], [], left=True)
    assert stream_hold.expire(svc, [job], time.time() + GRACE) == []
    assert svc.store.status(job.id) is JobStatus.QUEUED
    stream_hold.detach(svc, [job], [], left=True)  # the retry's client leaves too
    assert stream_hold.expire(svc, [job], time.time() + GRACE) == [job]
    assert svc.store.status(job.id) is JobStatus.CANCELED


def test_the_grace_runs_from_the_last_reader_leaving(svc: Services) -> None:
    job = stored_job(svc)
    stream_hold.attach(svc, [job])
    stream_hold.detach(svc, [job], [], left=True)
    assert stream_hold.expire(svc, [job], time.time() + GRACE / 2) == []  # within the grace
    assert svc.store.status(job.id) is JobStatus.QUEUED
    assert stream_hold.expire(svc, [job], time.time() + GRACE) == [job]
    assert svc.store.status(job.id) is JobStatus.CANCELED
