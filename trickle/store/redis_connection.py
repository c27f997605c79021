"""How every Trickle process connects to Redis: one set of client options, three shapes.

One URL names the job-state Redis: a single server, or a Redis Cluster. ``redis://``,
``rediss://`` and ``unix://`` connect to one server. ``redis+cluster://host:port``
(``rediss+cluster://`` with TLS) names any node of a cluster; the client discovers the others and
follows slot moves and failovers. Every key a job owns shares its shard's hash tag (``keys``), so
each script and transaction stays on one slot, and the token plane uses sharded pub/sub
(SPUBLISH/SSUBSCRIBE), which a cluster keeps on the shard that owns the channel's slot.

Celery's queue is not here: kombu's Redis transport cannot use a cluster, so with a cluster the
queue needs its own broker (``broker.url``, see ``worker.queueing``).
"""

from __future__ import annotations

import select
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from trickle.config.sections import RedisSettings

HEALTH_CHECK_SECONDS = 30
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def client_options(settings: RedisSettings, binary: bool = False) -> dict[str, Any]:
    """Text replies (bytes with ``binary``: stored files), bounded waits, and a ping before
    reusing a connection idle for long."""
    return {
        "decode_responses": not binary,
        "socket_timeout": settings.socket_timeout_seconds,
        "socket_connect_timeout": settings.socket_timeout_seconds,
        "health_check_interval": HEALTH_CHECK_SECONDS,
    }


def connect(settings: RedisSettings) -> Any:
    """A client with its own pool (a worker: few threads, few connections); a cluster client
    for a cluster URL (same commands, routed by slot)."""
    return _connect(settings.url, client_options(settings))


def connect_pooled(settings: RedisSettings, binary: bool = False) -> Any:
    """A client over a blocking pool: requests wait for a free connection instead of opening
    one each, so a web process's connections stay capped however many streams are open (per
    node, on a cluster)."""
    if is_cluster_url(settings.url):
        options = {**client_options(settings, binary), "max_connections": settings.max_connections}
        return _connect(settings.url, options)
    extra: dict[str, Any] = {}
    if urlsplit(settings.url).scheme == "redis":
        extra["connection_class"] = CheckedWithoutYield
    pool = redis.BlockingConnectionPool.from_url(
        settings.url,
        max_connections=settings.max_connections,
        timeout=settings.socket_timeout_seconds,
        **client_options(settings, binary),
        **extra,
    )
    return redis.Redis(connection_pool=pool)


def _unpatched_poll() -> Callable[[], Any]:
    """``select.poll`` as the OS gives it, also where gevent patched it (the web tier)."""
    if "gevent.monkey" in sys.modules:
        from gevent import monkey

        poll: Callable[[], Any] = monkey.get_original("select", "poll")
        return poll
    return select.poll


class CheckedWithoutYield(redis.Connection):
    """redis-py's TCP connection, with its readiness check on every pool checkout made by the
    OS's ``poll`` with a zero timeout.

    The pool checks that a connection holds no unread reply before lending it
    (``can_read(0)``). Under gevent that went through gevent's cooperative ``poll``: watchers
    started and stopped and a turn of the event loop, on every Redis call a request made (3.8%
    of a web process's CPU on short jobs). A zero-timeout ``poll`` never blocks, so the
    unpatched one is safe in a greenlet. Only the common answer (nothing to read) is taken
    here; anything else, buffered bytes included, is redis-py's own check."""

    _poll: Callable[[], Any] | None = None

    def can_read(self, timeout: float = 0) -> bool:
        sock = self._sock
        reader = getattr(self._parser, "_reader", None)
        quick = timeout == 0 and hasattr(select, "poll") and reader is not None
        if sock is not None and quick and not reader.has_data():
            poll_class = CheckedWithoutYield._poll
            if poll_class is None:
                poll_class = CheckedWithoutYield._poll = _unpatched_poll()
            poller = poll_class()
            poller.register(sock.fileno(), select.POLLIN)
            if not poller.poll(0):
                return False
        return bool(super().can_read(timeout))


def connect_subscriber(settings: RedisSettings) -> Any:
    """A client for pub/sub. It blocks on reads, so it must not time out on quiet channels; it
    pings on its own (web.streams.subscriber); and a broken connection must surface instead of being
    retried behind its back, since messages sent meanwhile are lost and readers must re-read."""
    options = {
        **client_options(settings),
        "socket_timeout": None,
        "socket_keepalive": True,
        "health_check_interval": 0,
        "retry": Retry(NoBackoff(), 0),
    }
    return _connect(settings.url, options)


def _connect(url: str, options: dict[str, Any]) -> Any:
    if is_cluster_url(url):
        options = {k: v for k, v in options.items() if k != "health_check_interval"}
        return RedisCluster.from_url(node_url(url), **options)
    return redis.Redis.from_url(url, **options)


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def node_url(url: str) -> str:
    """A cluster URL as redis-py takes it: the plain scheme, and no database (a cluster has only
    database 0)."""
    parts = urlsplit(url)
    scheme = CLUSTER_SCHEMES.get(parts.scheme, parts.scheme)
    path = "" if parts.scheme in CLUSTER_SCHEMES else parts.path
    return urlunsplit((scheme, parts.netloc, path, parts.query, parts.fragment))


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def publish_command(client: Any) -> str:
    """What the scripts publish tokens with: sharded pub/sub on a cluster (a plain PUBLISH is
    broadcast to every node of a cluster), plain pub/sub on a single server (Redis 6 has no
    SPUBLISH)."""
    return "SPUBLISH" if is_cluster(client) else "PUBLISH"
