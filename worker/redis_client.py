"""One URL names the job-state Redis: a single server, or a Redis Cluster.

``redis://``, ``rediss://`` and ``unix://`` connect to one server. ``redis+cluster://host:port``
(``rediss+cluster://`` with TLS) names any node of a cluster; the client discovers the others and
follows slot moves and failovers. Every key a job owns shares its shard's hash tag (``keys``), so
each script and transaction stays on one slot, and the token plane uses sharded pub/sub
(SPUBLISH/SSUBSCRIBE), which a cluster keeps on the shard that owns the channel's slot.

The Celery broker is not here: kombu's Redis transport cannot use a cluster, so on a cluster
the queue needs its own broker URL (see ``worker.queueing``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.cluster import RedisCluster

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

# A client for job state and tokens: a plain Redis, or a cluster (same commands, routed by slot).
Client = redis.Redis | RedisCluster


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def node_url(url: str) -> str:
    """The URL as redis-py's node clients take it (the cluster marker removed)."""
    parts = urlsplit(url)
    scheme = CLUSTER_SCHEMES.get(parts.scheme, parts.scheme)
    path = "" if parts.scheme in CLUSTER_SCHEMES else parts.path  # a cluster has only db 0
    return urlunsplit((scheme, parts.netloc, path, parts.query, parts.fragment))


def connect(url: str, **options: Any) -> Any:
    """A client for ``url``; ``options`` are redis-py connection options (timeouts...)."""
    if is_cluster_url(url):
        options.pop("health_check_interval", None)  # node clients get their own checks
        return RedisCluster.from_url(node_url(url), **options)
    return redis.Redis.from_url(url, **options)


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def publish_command(client: Any) -> str:
    """What the scripts publish tokens with: sharded pub/sub on a cluster (a plain PUBLISH is
    broadcast to every node of a cluster), plain pub/sub on a single server (Redis 6 has no
    SPUBLISH)."""
    return "SPUBLISH" if is_cluster(client) else "PUBLISH"
