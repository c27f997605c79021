"""kombu's Redis transport, keeping one synchronous client per channel.

kombu builds a new ``redis.Redis`` for every synchronous command it sends: the unacked-index
write when a message is delivered, the ack when a task ends, each restore. redis-py 8 fills a
response-callback table of a few hundred entries in every constructor, so on a one-token job
the worker spent about a quarter of its CPU there (py-spy, ``Channel._create_client``). A
redis-py client is thread-safe (every command borrows a connection from the pool), so one per
channel and pool does the same work. Used on plain ``redis://`` brokers only
(``worker.queueing.make_celery``); TLS, Sentinel and RabbitMQ keep kombu's own transports.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

TRANSPORT_PATH = "worker.broker_transport:Transport"


class Channel(kombu_redis.Channel):
    """A kombu Redis channel that builds its synchronous client once per connection pool."""

    _sync_client: Any = None
    _sync_client_pool: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool  # kombu drops and rebuilds its pools after a fork or a disconnect
        if self._sync_client is None or self._sync_client_pool is not pool:
            self._sync_client = super()._create_client(asynchronous=False)
            self._sync_client_pool = pool
        return self._sync_client


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with the channel above."""

    Channel = Channel
