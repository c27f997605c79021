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

After each ``BRPOP`` delivery the channel also takes, in one script, the messages already waiting
behind it (up to the prefetch window's room, ``trickle_drain_max`` at most: a few, so workers
that share a queue still take turns at a burst): kombu's transport
returns one message per ``BRPOP``, one event-loop turn and round trip each, so a 16-job burst
reached the worker over 20 ms. The keys are read in the order ``BRPOP`` reads them (priority
steps, then queues), so batch work still waits behind interactive work. Off (0) where named keys
have queues of their own: draining one key's queue would skip the round-robin turns between them.

A transport class in ``broker_transport`` is kombu's and Celery's documented way to change a
transport; the broker protocol, the queues, priorities and the visibility timeout are kombu's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

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
    _drain_script: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
        elif self._pushes_into is not None:
            yield self._pushes_into
        else:
            yield self._create_client()

    def _brpop_read(self, **options: Any) -> Any:
        delivered = super()._brpop_read(**options)  # type: ignore[no-untyped-call]
        if delivered:
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
