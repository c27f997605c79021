"""kombu's Redis transport, with one client per channel instead of one per command.

kombu's Redis ``Channel.conn_or_acquire`` builds a new ``redis.Redis`` for every command it
sends without a client in hand: every publish (``_put``), every ack and every ``QoS.append``
(the unacked bookkeeping of each delivered message). A ``redis.Redis`` builds its table of
response callbacks (about 170 entries) when it is made: half of the 0.3 ms of CPU a
``send_task`` cost here, and 8% of a worker's CPU on short jobs. The client shares the
channel's connection pool either way (it holds no connection itself), so one per channel does
what the many did.

A channel can also queue its publishes' ``LPUSH`` on a pipeline of the caller's
(``writing_into``): where the broker is the job store's own Redis, a job's record and its task
message (built by Celery, pushed by kombu's ``_put``) then go in one transaction, one round trip,
and neither can exist without the other.

A transport class in ``broker_transport`` is kombu's and Celery's documented way to change a
transport; the broker protocol, the queues, priorities and the visibility timeout are kombu's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis

TRANSPORT = "worker.redis_transport:Transport"


class _PushesInto:
    """The channel's client, but a message's LPUSH goes on ``pipe`` (declarations, reads and
    anything else kombu sends still go straight to Redis)."""

    def __init__(self, pipe: Any, client: Any):
        self._pipe = pipe
        self._client = client

    def lpush(self, name: str, *values: Any) -> None:
        self._pipe.lpush(name, *values)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class Channel(kombu_redis.Channel):
    _sync_client: Any = None
    _pushes_into: _PushesInto | None = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
        elif self._pushes_into is not None:
            yield self._pushes_into
        else:
            yield self._create_client()

    @contextmanager
    def writing_into(self, pipe: Any) -> Iterator[None]:
        """Publishes on this channel, inside the block, queue their LPUSH on ``pipe`` (a redis
        pipeline, or a recorder of writes for a script); the caller executes it. The channel is
        the caller's alone meanwhile (a producer acquired from the pool)."""
        self._pushes_into = _PushesInto(pipe, self._create_client())
        try:
            yield
        finally:
            self._pushes_into = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the BRPOP/LISTEN client: kombu keeps one already (Channel.client)
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        client = self._sync_client
        if client is None or client.connection_pool is not self.pool:  # a new pool: a new one
            client = self._sync_client = super()._create_client()  # type: ignore[no-untyped-call]
        return client


class Transport(kombu_redis.Transport):
    Channel = Channel
