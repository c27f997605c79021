"""The web tier's Services lock is built by ``threading.Lock`` as gevent leaves it patched.

gunicorn's config imports ``web`` before the gevent worker patches ``threading``; a lock factory
bound at import was the real one, and a greenlet that waited on it while another held it across
a Redis read (the first stream URL) froze the whole process: two concurrent first POSTs hung
until their clients gave up (3 stacks in 5 with two clients posting at once)."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from web.services import Services


def test_the_lock_factory_looks_threading_lock_up_when_services_are_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    patched = object()
    monkeypatch.setattr(threading, "Lock", lambda: patched)
    (lock,) = [field for field in dataclasses.fields(Services) if field.name == "_lock"]
    assert lock.default_factory is not dataclasses.MISSING
    assert lock.default_factory() is patched
