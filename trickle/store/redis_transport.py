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

After a ``BRPOP`` delivery the channel also takes, in one script, the messages already waiting
behind it (up to the prefetch window's room, ``trickle_drain_max`` at most: a few, so workers
that share a queue still take turns at a burst): kombu's transport returns one message per
``BRPOP``, one event-loop turn and round trip each, so a 16-job burst reached the worker over
20 ms. Only after a ``BRPOP`` that answered at once (within ``DRAIN_AFTER_SECONDS`` of its
sending: its queue had a backlog): one that waited for its message found the queues empty, and
the drain came back empty, a round trip and five commands per job for a client sending one job
at a time. A backlog that forms meanwhile costs one more ``BRPOP``, which answers at once and
drains it. The keys are read in the order ``BRPOP`` reads them (priority steps, then queues), so
batch work still waits behind interactive work. Off (0) where keys have queues of their
own: draining one key's queue would skip the round-robin turns between them.

A queue consumed again (``add_task_queue``: a key held back on this worker resumes, see
worker/dispatch.py) is read at once: kombu's ``BRPOP`` in flight names the queues of before and
would hold the new one back for up to ``brpop_timeout`` (1 s), an idle lane each time a flood's
batch ended; the channel ends that wait with ``CLIENT UNBLOCK`` (as its timeout would), and
kombu's next ``BRPOP`` names the queue. Where the server refuses ``CLIENT`` (an ACL), the wait
is kombu's. A queue paused meanwhile (``cancel_task_queue``) can still get a message from the
``BRPOP`` that named it: kombu requeued that one at the *tail* of its queue ("No consumers"), so
it waited behind the whole backlog; it goes back to the head here, where it was.

A delivered message's unacked entry (kombu's ``QoS.append``: the ``unacked`` hash and its
index, what the visibility timeout restores) is sent before the message goes to the consumer, as
kombu sends it, but its reply is read later (``UnackedWriter``: before a requeue or a restore
reads entries on another client): kombu waited for that reply, a round trip (0.44 ms p50)
between Redis handing over a task and Celery seeing it, on every job. The bytes are on Redis's
socket before the message is handed on, so a worker killed after that point leaves the entry
exactly as kombu's did; an entry Redis refused is logged. A message's ack (the entry's removal)
goes the same way, on the same connection, so Redis applies it after the entry: kombu's ack held
the consumer a round trip per finished job, while the next tasks waited to be read.

A transport class in ``broker_transport`` is kombu's and Celery's documented way to change a
transport; the broker protocol, the queues, priorities and the visibility timeout are kombu's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads

# Transport option: the most messages taken after a BRPOP in one round trip (0: kombu's one).
DRAIN_OPTION = "trickle_drain_max"

# Pops up to ARGV[1] messages from KEYS in order (oldest first within each, as BRPOP does):
# a flat list of (key index, message) pairs.
DRAIN_SCRIPT = """
local want = tonumber(ARGV[1])
local taken = {}
for index, key in ipairs(KEYS) do
  while want > 0 do
    local item = redis.call('RPOP', key)
    if not item then break end
    taken[#taken + 1] = index
    taken[#taken + 1] = item
    want = want - 1
  end
  if want == 0 then break end
end
return taken
"""

TRANSPORT = "trickle.store.redis_transport:Transport"

log = logging.getLogger(__name__)
REFUSED = "kombu's unacked bookkeeping (an entry or its ack) was refused by Redis: %s"

# A BRPOP answered within this long of its sending found a backlog: what waits behind its
# message is taken at once. One that waited longer found its queues empty.
DRAIN_AFTER_SECONDS = 0.002


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


class UnackedWriter:
    """Sends kombu's unacked entries and their acks on a connection of their own without
    waiting for the replies, which are read when another client must see an entry (a requeue,
    a restore: ``settle``), or once ``MAX_UNREAD`` of them wait. One connection keeps an entry's
    write before its ack."""

    MAX_UNREAD = 64  # replies; each a few bytes in the socket's buffer
    # After this long without a send, the replies are read and the socket checked before the
    # next: a connection the server closed meanwhile would take one send into the void.
    IDLE_CHECK_SECONDS = 1.0

    def __init__(self, pool: Any):
        self.pool = pool
        self._conn: Any = None
        self._unread = 0
        self._last_sent = 0.0
        self._lock = threading.Lock()

    def send(self, commands: list[tuple[Any, ...]]) -> None:
        """Send ``commands`` as one MULTI / EXEC transaction, as kombu's pipelines do."""
        commands = [("MULTI",), *commands, ("EXEC",)]
        with self._lock:
            now = time.monotonic()
            idle = now - self._last_sent > self.IDLE_CHECK_SECONDS
            if self._unread >= self.MAX_UNREAD or idle:
                self._read_replies()
            if idle:
                self._drop_if_closed()
            conn = self._connection()
            try:
                # No health check: its PING would read an unread reply as its own.
                conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            except BaseException:
                self._drop()
                raise
            self._unread += len(commands)
            self._last_sent = now

    def settle(self) -> None:
        """Read every reply sent for (each entry sent is in Redis once this returns)."""
        with self._lock:
            self._read_replies()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _connection(self) -> Any:
        if self._conn is None:
            self._conn = self.pool.get_connection()
        return self._conn

    def _drop_if_closed(self) -> None:
        """With every reply read, a readable socket holds only the server's close."""
        conn = self._conn
        if conn is None:
            return
        try:
            closed = conn.can_read(timeout=0)
        except redis.ConnectionError:
            closed = True
        if closed:
            self._drop()

    def _read_replies(self) -> None:
        conn = self._conn
        while self._unread and conn is not None:
            self._unread -= 1
            try:
                reply = conn.read_response()
            except redis.ResponseError as exc:  # e.g. an OOM refusal: the consumer goes on
                log.error(REFUSED, exc)
                continue
            except BaseException:
                self._drop()
                raise
            for part in reply if isinstance(reply, list) else ():
                if isinstance(part, Exception):
                    log.error(REFUSED, part)

    def _drop(self) -> None:
        conn, self._conn, self._unread = self._conn, None, 0
        if conn is not None:
            conn.disconnect()
            self.pool.release(conn)


class QoS(kombu_redis.QoS):
    """kombu's Redis QoS, with ``append``'s and ``ack``'s writes sent by the channel's
    ``UnackedWriter`` (the same MULTI / ZADD / HSET / EXEC and MULTI / ZREM / HDEL / EXEC)
    instead of waited for; whatever reads an entry on another client first settles the writer,
    so it always finds the entry as written."""

    def append(self, message: Any, delivery_tag: str) -> None:
        if self.channel.global_keyprefix:  # kombu's client prefixes keys; this connection would not
            super().append(message, delivery_tag)  # type: ignore[no-untyped-call]
            return
        delivery = message.delivery_info
        record = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])  # type: ignore[no-untyped-call]
        self.channel.unacked_writer.send(
            [
                ("ZADD", self.unacked_index_key, time.time(), delivery_tag),
                ("HSET", self.unacked_key, delivery_tag, record),
            ]
        )
        virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]

    def ack(self, delivery_tag: str) -> None:
        """kombu's ack (MULTI / ZREM / HDEL / EXEC), sent the same way: on the connection that
        sent the entry, so Redis applies them in order; it blocked the consumer a round trip
        per finished job."""
        if self.channel.global_keyprefix:
            super().ack(delivery_tag)  # type: ignore[no-untyped-call]
            return
        self.channel.unacked_writer.send(
            [
                ("ZREM", self.unacked_index_key, delivery_tag),
                ("HDEL", self.unacked_key, delivery_tag),
            ]
        )
        virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if not requeue:
            self.ack(delivery_tag)  # what kombu's reject does without a requeue
            return
        self.channel.unacked_writer.settle()  # the restore reads the entry on another client
        super().reject(delivery_tag, requeue)  # type: ignore[no-untyped-call]

    def restore_by_tag(self, tag: str, client: Any = None, leftmost: bool = False) -> None:
        # At a lost connection's close the writer's socket is gone too: restore what can be.
        with contextlib.suppress(redis.RedisError):
            self.channel.unacked_writer.settle()
        super().restore_by_tag(tag, client, leftmost)  # type: ignore[no-untyped-call]


class Channel(kombu_redis.Channel):
    QoS = QoS
    _unacked_writer: UnackedWriter | None = None
    _sync_client: Any = None
    _pushes_into: _PushesInto | None = None
    _drain_script: Any = None
    # The BRPOP connection's socket and its server-side client id (None: unknown or refused).
    _brpop_sock: Any = None
    _brpop_id: int | None = None
    _brpop_began = 0.0  # time.monotonic() when the BRPOP in flight was sent

    def basic_consume(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        consumer_tag = super().basic_consume(queue, *args, **kwargs)  # type: ignore[no-untyped-call]
        self._end_brpop_wait()
        return consumer_tag

    def _brpop_start(self, timeout: Any = None) -> None:
        self._learn_brpop_id()
        super()._brpop_start(timeout)  # type: ignore[no-untyped-call]
        self._brpop_began = time.monotonic()

    def _learn_brpop_id(self) -> None:
        """The server's id of the BRPOP connection (one round trip per new socket, while the
        connection is idle: no BRPOP is in flight yet)."""
        connection = self.client.connection
        sock = getattr(connection, "_sock", None)
        if sock is None or sock is self._brpop_sock:
            return
        self._brpop_sock, self._brpop_id = sock, None
        try:
            connection.send_command("CLIENT", "ID")
            self._brpop_id = int(self.client.parse_response(connection, "CLIENT"))
        except redis.ResponseError:  # CLIENT not allowed: a resumed queue waits out the BRPOP
            pass

    def _end_brpop_wait(self) -> None:
        """End a BRPOP in flight as its timeout would (kombu then sends the next one, which
        names every queue consumed now)."""
        if not self._in_poll or self._brpop_id is None:
            return
        with contextlib.suppress(redis.RedisError):  # else the BRPOP ends at its own timeout
            self._create_client().execute_command("CLIENT", "UNBLOCK", self._brpop_id)

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
        elif self._pushes_into is not None:
            yield self._pushes_into
        else:
            yield self._create_client()

    def _brpop_read(self, **options: Any) -> Any:
        # Read as the answer arrives: how long it took, before the delivery's own work.
        waited = time.monotonic() - self._brpop_began
        delivered = super()._brpop_read(**options)  # type: ignore[no-untyped-call]
        if delivered and waited <= DRAIN_AFTER_SECONDS:
            self._deliver_waiting()
        return delivered

    def _deliver_waiting(self) -> None:
        """Deliver the messages already waiting in the consumed queues, in one round trip; any
        the consumer did not take (it raised) go back to the queue's head, in their order."""
        limit = int(self.connection.client.transport_options.get(DRAIN_OPTION, 0) or 0)
        room = self.qos.can_consume_max_estimate()
        want = limit if room is None else min(limit, room)
        queues = list(self.active_queues)
        if want <= 0 or not queues or self.global_keyprefix:
            return
        key_of: Any = self._q_for_pri
        # BRPOP's own order: each queue's first priority step, then each one's next step, ...
        keys = [(key_of(queue, pri), queue) for pri in self.priority_steps for queue in queues]
        client = self._create_client()
        if self._drain_script is None or self._drain_script.registered_client is not client:
            self._drain_script = client.register_script(DRAIN_SCRIPT)  # EVALSHA, loads on NOSCRIPT
        taken = self._drain_script(keys=[key for key, _ in keys], args=[want], client=client)
        pairs = [(int(taken[i]) - 1, taken[i + 1]) for i in range(0, len(taken), 2)]
        delivered = 0
        try:
            for index, item in pairs:
                message = loads(bytes_to_str(item))  # type: ignore[no-untyped-call]
                self.connection._deliver(message, keys[index][1])
                delivered += 1
        finally:
            left = pairs[delivered + 1 :] if delivered < len(pairs) else []
            for index, item in reversed(left):  # the newest first: RPUSH puts each at the head
                client.rpush(keys[index][0], item)

    def requeue_at_head(self, payload: dict[str, Any], queue: str) -> None:
        """Put a message the consumer no longer takes back where BRPOP took it from."""
        priority = self._get_message_priority(payload, reverse=False)  # type: ignore[no-untyped-call]
        key_of: Any = self._q_for_pri
        encode: Any = dumps
        self._create_client().rpush(key_of(queue, priority), encode(payload))

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

    @property
    def unacked_writer(self) -> UnackedWriter:
        writer = self._unacked_writer
        if writer is None or writer.pool is not self.pool:  # a new pool: a new connection
            if writer is not None:
                writer.close()
            writer = self._unacked_writer = UnackedWriter(self.pool)
        return writer

    def close(self) -> None:
        try:
            super().close()  # type: ignore[no-untyped-call]
        finally:
            if self._unacked_writer is not None:
                self._unacked_writer.close()

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the BRPOP/LISTEN client: kombu keeps one already (Channel.client)
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        client = self._sync_client
        if client is None or client.connection_pool is not self.pool:  # a new pool: a new one
            client = self._sync_client = super()._create_client()  # type: ignore[no-untyped-call]
        return client


class Transport(kombu_redis.Transport):
    Channel = Channel

    def _deliver(self, message: Any, queue: str) -> None:
        channel = next((channel for channel in self.channels if channel), None)
        if queue and queue not in self._callbacks and isinstance(channel, Channel):
            channel.requeue_at_head(message, queue)  # a paused queue's last message
            return
        super()._deliver(message, queue)  # type: ignore[no-untyped-call]
