"""The web tier's pooled connections check readiness without a cooperative poll, and still
catch what redis-py's own check catches: an unread reply, and a connection the server closed."""

from __future__ import annotations

import time

import redis

from trickle.config.sections import RedisSettings
from trickle.store.redis_connection import CheckedWithoutYield, connect_pooled


def pooled(server: redis.Redis) -> redis.Redis:
    port = server.connection_pool.connection_kwargs["port"]
    client: redis.Redis = connect_pooled(RedisSettings(url=f"redis://127.0.0.1:{port}/0"))
    return client


def test_a_plain_redis_url_lends_connections_checked_without_a_yield(
    private_redis: redis.Redis,
) -> None:
    client = pooled(private_redis)
    assert client.connection_pool.connection_class is CheckedWithoutYield
    assert client.ping()
    connection = client.connection_pool.get_connection()
    try:
        assert not connection.can_read()  # nothing pending: the quick answer
        connection.send_command("PING")
        deadline = time.monotonic() + 5
        while not connection.can_read():  # the reply is on its way
            assert time.monotonic() < deadline, "a reply waits unread"
            time.sleep(0.001)
        assert connection.read_response() == "PONG"
        assert not connection.can_read()
    finally:
        client.connection_pool.release(connection)
    client.connection_pool.disconnect()


def test_a_connection_the_server_closed_is_replaced_on_checkout(
    private_redis: redis.Redis,
) -> None:
    client = pooled(private_redis)
    pool = client.connection_pool
    connection = pool.get_connection()
    connection.send_command("CLIENT", "SETNAME", "to-be-killed")
    assert connection.read_response() == "OK"
    closed_socket = connection._sock
    pool.release(connection)
    assert private_redis.client_kill_filter(_type="normal", skipme=True) >= 1
    deadline = time.monotonic() + 5
    while True:  # the server's close reaches the socket
        again = pool.get_connection()
        replaced = again._sock is not closed_socket
        pool.release(again)
        if replaced:
            break
        assert time.monotonic() < deadline, "the closed connection was lent as it was"
        time.sleep(0.01)
    assert client.ping()
    client.connection_pool.disconnect()
