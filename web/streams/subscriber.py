"""One pub/sub connection per web process, subscribed to exactly the channels its readers need.

Readers come and go on request threads (greenlets under gevent); only the listener thread
touches the connection. ``add`` records a channel and wakes the listener (a pipe), which sends
SUBSCRIBE/UNSUBSCRIBE for the difference between wanted and subscribed channels and sets the
channel's ready event once Redis confirms it: a reader that waits for that and then reads the
replay log can miss nothing. When a connection breaks, ``on_lost`` tells every reader to re-read,
and each channel, once subscribed again, is announced through ``on_subscribed``.

On a Redis Cluster there is one connection per primary that owns a wanted channel's slot, with
SSUBSCRIBE (sharded pub/sub: a message only travels within its shard). A slot that moves (the
server drops its subscriptions) or a failover (the connection breaks) sends every channel
through a fresh subscription.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from trickle.store.redis_connection import is_cluster

try:  # what redis-py's hiredis reader returns for "no complete reply buffered"
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _INCOMPLETE
except ImportError:  # pragma: no cover - another redis-py layout: False is hiredis's default
    _INCOMPLETE = False

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
PING_SECONDS = 30.0  # an idle connection is checked this often (a dead peer is noticed)
STABLE_SECONDS = 10.0  # a connection that lasted this long resets the reconnection backoff


class _Link:
    """The pub/sub connection to one server (the only one, or one cluster primary)."""

    def __init__(self, client: redis.Redis, sharded: bool):
        self.pubsub = client.pubsub()
        self.sharded = sharded
        self.channels: set[str] = set()  # SUBSCRIBE sent, UNSUBSCRIBE not
        self.last_traffic = time.monotonic()

    def subscribe(self, channels: list[str]) -> None:
        (self.pubsub.ssubscribe if self.sharded else self.pubsub.subscribe)(*channels)
        self.channels.update(channels)

    def unsubscribe(self, channels: list[str]) -> None:
        (self.pubsub.sunsubscribe if self.sharded else self.pubsub.unsubscribe)(*channels)
        self.channels.difference_update(channels)

    def next_message(self) -> dict[str, Any] | None:
        if self.pubsub.connection is None:
            return None
        message: dict[str, Any] | None = self.pubsub.get_message(timeout=0)
        if message is not None:
            self.last_traffic = time.monotonic()
        return message

    def buffered_messages(self) -> list[dict[str, Any]] | None:
        """Every complete message the parser already holds, parsed without touching the socket;
        None where the connection's parser is not hiredis (then ``next_message`` reads).

        ``get_message`` polls the socket once per message (two polls, a timeout and a retry
        wrapper under gevent): at one message per job per flush that was a third of a web
        process's CPU. Here one ``recv`` (``receive``) feeds many messages.
        """
        connection = self.pubsub.connection
        reader = getattr(getattr(connection, "_parser", None), "_reader", None)
        if connection is None or reader is None or not hasattr(reader, "gets"):
            return None
        messages: list[dict[str, Any]] = []
        while (response := reader.gets()) is not _INCOMPLETE and response is not False:
            if isinstance(response, Exception):
                raise response
            if self.pubsub.is_health_check_response(response):
                continue
            message = self.pubsub.handle_message(response)
            if message is not None:
                messages.append(message)
        if messages:
            self.last_traffic = time.monotonic()
        return messages

    def receive(self) -> None:
        """Read what the socket holds into the parser (the caller saw it readable)."""
        connection = self.pubsub.connection
        parser = getattr(connection, "_parser", None)
        if parser is not None and hasattr(parser, "read_from_socket"):
            parser.read_from_socket()  # one recv; a closed connection raises ConnectionError

    def socket(self) -> Any:
        connection = self.pubsub.connection
        return getattr(connection, "_sock", None) if connection is not None else None

    def fileno(self) -> int | None:
        sock = self.socket()
        return sock.fileno() if sock is not None else None

    def keep_alive(self) -> None:
        idle = time.monotonic() - self.last_traffic > PING_SECONDS
        if idle and self.pubsub.connection is not None and self.channels:
            self.pubsub.ping()  # its "pong" arrives as a message; a dead peer raises
            self.last_traffic = time.monotonic()

    def close(self) -> None:
        self.pubsub.close()


class ChannelSubscriber:
    def __init__(
        self,
        connect: Callable[[], Any],
        on_message: Callable[[str, str], None],
        on_subscribed: Callable[[str], None],
        on_lost: Callable[[], None],
    ):
        self._connect = connect
        self._on_message = on_message
        self._on_subscribed = on_subscribed
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._wanted: dict[str, int] = {}  # channel -> readers wanting it
        self._ready: dict[str, threading.Event] = {}  # set once Redis confirmed it
        self._pending: dict[str, int] = {}  # SUBSCRIBEs not confirmed yet
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # Set when readers changed what is wanted: only then does the listener compare wanted
        # and subscribed channels (an O(channels) pass), not on every message.
        self._dirty = True

    @property
    def channels(self) -> int:
        with self._lock:
            return len(self._wanted)

    def add(self, channel: str) -> threading.Event:
        """Want ``channel`` (counted per reader); the event is set once it is subscribed."""
        with self._lock:
            self._start()
            self._wanted[channel] = self._wanted.get(channel, 0) + 1
            ready = self._ready.setdefault(channel, threading.Event())
            self._dirty = True
        self._wake()
        return ready

    def remove(self, channel: str) -> None:
        """One reader fewer for ``channel``. The last one's leaving does not wake the listener:
        the UNSUBSCRIBE goes with its next pass (the next message or subscription, or the poll
        within ``POLL_SECONDS``). A finished job's channel carries nothing more, and a wake per
        stream's end was a pass of the listener per job (one web process, one core)."""
        with self._lock:
            if not _count_down(self._wanted, channel):
                return
            # No reader wants it: its ready event goes when it is unsubscribed.
            self._dirty = True

    def close(self) -> None:
        """Stop listening (the app is shutting down); returns within one poll interval."""
        self._stopping.set()
        self._wake()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=POLL_SECONDS * 3)

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trickle-hub", daemon=True)
            self._thread.start()

    def _wake(self) -> None:
        # A full pipe means wake-ups are pending anyway.
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_write, b"x")

    def _run(self) -> None:
        backoff = 0.1
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self._listen()
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError, OSError) as exc:
                # A ResponseError here is a cluster's MOVED: the slot map changed under us.
                log.warning("token subscription lost (%s); reconnecting in %.1fs", exc, backoff)
            with self._lock:
                self._pending.clear()
                # Every channel needs a new subscription; readers already waiting keep theirs.
                self._ready = {
                    channel: ready
                    for channel, ready in self._ready.items()
                    if channel in self._wanted and not ready.is_set()
                }
            self._on_lost()
            if time.monotonic() - started > STABLE_SECONDS:
                backoff = 0.1  # it had worked for a while: this is a new outage
            self._stopping.wait(backoff)
            backoff = min(backoff * 2, 5.0)

    def _listen(self) -> None:
        client = self._connect()
        links: dict[str, _Link] = {}
        # One selector for the connection's life: its registrations persist (under gevent, a
        # select() call built and dropped a watcher per socket on every wake-up).
        selector = selectors.DefaultSelector()
        selector.register(self._wake_read, selectors.EVENT_READ)
        with self._lock:
            self._dirty = True  # a new connection subscribes to everything wanted
        try:
            while not self._stopping.is_set():
                if self._dirty:
                    self._sync(client, links)
                maybe_buffered = self._drain(links)
                for link in self._wait(selector, links, 0.0 if maybe_buffered else POLL_SECONDS):
                    link.receive()
                for link in links.values():
                    link.keep_alive()
        finally:
            selector.close()
            for link in links.values():
                link.close()
            client.close()

    def _sync(self, client: Any, links: dict[str, _Link]) -> None:
        """Send SUBSCRIBE and UNSUBSCRIBE for what changed since the last pass."""
        subscribed = {channel for link in links.values() for channel in link.channels}
        with self._lock:
            self._dirty = False
            wanted = set(self._wanted)
            for channel in subscribed - wanted:
                # A reader arriving after this point waits for a new subscription.
                self._ready.pop(channel, None)
            for channel in wanted - subscribed:
                self._pending[channel] = self._pending.get(channel, 0) + 1
        for link in links.values():
            dropped = list(link.channels - wanted)
            if dropped:
                link.unsubscribe(dropped)
        adding: dict[str, list[str]] = {}
        for channel in wanted - subscribed:
            adding.setdefault(self._route(client, channel, links), []).append(channel)
        for name, channels in adding.items():
            links[name].subscribe(channels)

    def _route(self, client: Any, channel: str, links: dict[str, _Link]) -> str:
        """The link that carries ``channel``, opened on first use."""
        if not is_cluster(client):
            if "" not in links:
                links[""] = _Link(client, sharded=False)
            return ""
        node = client.get_node_from_key(channel)
        if node.name not in links:
            links[node.name] = _Link(client.get_redis_connection(node), sharded=True)
        return str(node.name)

    def _drain(self, links: dict[str, _Link]) -> bool:
        """Handle every message already received. True when more may wait in redis-py's own
        buffer, where a select cannot see them (no hiredis: one message read per call), so the
        next wait must not block. With hiredis every complete message was taken: the wait can
        block at once (a pass with a zero timeout after each delivery was a pass per message)."""
        maybe_buffered = False
        for link in list(links.values()):
            buffered = link.buffered_messages()
            if buffered is None:  # no hiredis: redis-py reads one message per call
                while (message := link.next_message()) is not None:
                    maybe_buffered = True
                    self._handle(link, message)
                continue
            for message in buffered:
                self._handle(link, message)
        return maybe_buffered

    def _handle(self, link: _Link, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind in ("message", "smessage"):
            self._on_message(str(message["channel"]), str(message["data"]))
        elif kind in ("subscribe", "ssubscribe"):
            self._confirmed(str(message["channel"]))
        elif kind == "sunsubscribe" and str(message["channel"]) in link.channels:
            # The server dropped it (its slot moved): subscribe again where it lives now.
            link.channels.discard(str(message["channel"]))
            raise redis.ConnectionError("a shard channel's slot moved")

    def _confirmed(self, channel: str) -> None:
        with self._lock:
            if not _count_down(self._pending, channel):
                return  # another SUBSCRIBE for it is still unconfirmed
            if channel not in self._wanted:
                return
            ready = self._ready.setdefault(channel, threading.Event())
        # Readers already following (a reconnect, a reader that stopped waiting) re-read what
        # they may have missed; one that waits for ``ready`` starts after this, missing nothing.
        self._on_subscribed(channel)
        ready.set()

    def _wait(
        self, selector: selectors.BaseSelector, links: dict[str, _Link], timeout: float
    ) -> list[_Link]:
        """Sleep until a connection has data, a reader wants a change, or ``timeout``; the
        links whose sockets are readable."""
        # A link without channels reads nothing (redis-py's pubsub is then idle): selecting its
        # socket would spin on whatever the server sends it, a close included.
        by_fd = {
            fd: link
            for link in links.values()
            if link.channels and (fd := link.fileno()) is not None
        }
        # Registered with its socket object: a socket that was replaced under the same number
        # (redis-py reconnected) is registered again.
        registered = {
            key.fd: key.data for key in selector.get_map().values() if key.fd != self._wake_read
        }
        for fd, sock in registered.items():
            if fd not in by_fd or by_fd[fd].socket() is not sock:
                selector.unregister(fd)
                registered[fd] = None
        for fd, link in by_fd.items():
            if registered.get(fd) is None:
                selector.register(fd, selectors.EVENT_READ, link.socket())
        readable = {key.fd for key, _ in selector.select(timeout)}
        if self._wake_read in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._wake_read, 4096):
                    pass
        return [by_fd[fd] for fd in readable if fd in by_fd]


def _count_down(counts: dict[str, int], channel: str) -> bool:
    """One fewer for ``channel``; True (and the entry gone) once none is left."""
    remaining = counts.get(channel, 0) - 1
    if remaining > 0:
        counts[channel] = remaining
        return False
    counts.pop(channel, None)
    return True
