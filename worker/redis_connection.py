"""How every Trickle process connects to Redis: one set of client options, three shapes."""

from __future__ import annotations

from typing import Any

import redis

from worker.config import RedisSettings

HEALTH_CHECK_SECONDS = 30


def client_options(settings: RedisSettings) -> dict[str, Any]:
    """Text replies, bounded waits, and a ping before reusing a connection idle for long."""
    return {
        "decode_responses": True,
        "socket_timeout": settings.socket_timeout_seconds,
        "socket_connect_timeout": settings.socket_timeout_seconds,
        "health_check_interval": HEALTH_CHECK_SECONDS,
    }


def connect(settings: RedisSettings) -> redis.Redis:
    """A client with its own pool (a worker: few threads, few connections)."""
    return redis.Redis.from_url(settings.url, **client_options(settings))


def connect_pooled(settings: RedisSettings) -> redis.Redis:
    """A client over a blocking pool: requests wait for a free connection instead of opening
    one each, so a web process's connections stay capped however many streams are open."""
    pool = redis.BlockingConnectionPool.from_url(
        settings.url,
        max_connections=settings.max_connections,
        timeout=settings.socket_timeout_seconds,
        **client_options(settings),
    )
    return redis.Redis(connection_pool=pool)


def connect_subscriber(settings: RedisSettings) -> redis.Redis:
    """A client for pub/sub: it blocks on reads, so it must not time out on a quiet channel."""
    options = {**client_options(settings), "socket_timeout": None, "socket_keepalive": True}
    return redis.Redis.from_url(settings.url, **options)
