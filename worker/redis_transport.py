"""kombu's Redis transport, with one client per channel instead of one per command.

kombu's Redis ``Channel.conn_or_acquire`` builds a new ``redis.Redis`` for every command it
sends without a client in hand: every publish (``_put``), every ack and every ``QoS.append``
(the unacked bookkeeping of each delivered message). A ``redis.Redis`` builds its table of
response callbacks (about 170 entries) when it is made: half of the 0.3 ms of CPU a
``send_task`` cost here, and 8% of a worker's CPU on short jobs. The client shares the
channel's connection pool either way (it holds no connection itself), so one per channel does
what the many did.

A transport class in ``broker_transport`` is kombu's and Celery's documented way to change a
transport; the broker protocol, the queues, priorities and the visibility timeout are kombu's.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

TRANSPORT = "worker.redis_transport:Transport"


class Channel(kombu_redis.Channel):
    _sync_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the BRPOP/LISTEN client: kombu keeps one already (Channel.client)
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        client = self._sync_client
        if client is None or client.connection_pool is not self.pool:  # a new pool: a new one
            client = self._sync_client = super()._create_client()  # type: ignore[no-untyped-call]
        return client


class Transport(kombu_redis.Transport):
    Channel = Channel
