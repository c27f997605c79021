"""The integration tier: real Redis (a private redis-server on a free port) and in-process apps,
no worker or web process. The stack's fixtures fail here, naming the tier that has them."""

from __future__ import annotations

from typing import NoReturn

import pytest


def _refuse(what: str) -> NoReturn:
    pytest.fail(
        f"the integration tier starts no {what}: move this test to tests/system", pytrace=False
    )


@pytest.fixture(scope="session")
def worker_process() -> None:
    _refuse("worker process")


@pytest.fixture(scope="session")
def web_url() -> str:
    _refuse("web process")
