"""The job WebSocket's server side: a handshake checked before the upgrade, and what the client
sends read, counted and dropped.

The stream is one-way (server to client), but a socket reads whatever arrives: simple_websocket
keeps every inbound message in a list for ``receive()``, so a client sending without pause
makes the web process hold all of it, and a handshake its protocol library refuses raises out
of the view as a 500. ``BoundedServer`` drops each message as it completes, closes with 1009
when one message (all its frames) passes ``web.ws_max_message_bytes`` and with 1008 when the
socket's inbound bytes pass ``web.ws_inbound_budget_bytes``; ``websocket_view`` answers a bad
handshake with a JSON 4xx naming the header, before anything is upgraded or looked up.

flask-sock's route builds simple_websocket's ``Server`` itself, with no way to answer a
refused handshake in HTTP or to choose the server class, so the view here does that part
(simple_websocket still speaks the protocol, through wsproto).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from flask import Response, request
from simple_websocket import ConnectionClosed, Server
from simple_websocket.errors import ConnectionError as HandshakeIncomplete
from wsproto.events import CloseConnection
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from web.common.errors import HttpError
from web.services import services

log = logging.getLogger(__name__)

WEBSOCKET_VERSION = "13"
NONCE_BYTES = 16  # RFC 6455 4.1: the key is 16 random bytes, base64-encoded
# After a close frame, how long and how many bytes the socket stays open to read (and drop)
# what the client had in flight and its own close frame: closing at once with unread bytes
# makes the kernel send RST, and the client may lose the close frame that tells it why. A
# client that writes on regardless is cut at either bound.
CLOSE_LINGER_SECONDS = 2.0
CLOSE_LINGER_BYTES = 1 << 20

Handler = Callable[..., None]


def handshake_error(message: str, header: str, status: int = 400) -> HttpError:
    headers = {"Sec-WebSocket-Version": WEBSOCKET_VERSION} if status == 426 else None
    return HttpError(
        status, "invalid_request_error", message, param=header, code="invalid_websocket_handshake",
        headers=headers,
    )  # fmt: skip


def check_handshake() -> None:
    """Refuse, in HTTP and naming the header, an upgrade request RFC 6455 would not accept."""
    headers = request.headers
    if request.method != "GET":
        raise handshake_error("a WebSocket upgrade must be a GET", "method")
    if headers.get("Upgrade", "").strip().lower() != "websocket":
        raise handshake_error("a WebSocket upgrade needs 'Upgrade: websocket'", "Upgrade")
    tokens = {token.strip().lower() for token in headers.get("Connection", "").split(",")}
    if "upgrade" not in tokens:
        raise handshake_error("a WebSocket upgrade needs 'Connection: Upgrade'", "Connection")
    version = headers.get("Sec-WebSocket-Version", "").strip()
    if version != WEBSOCKET_VERSION:
        raise handshake_error(
            f"only WebSocket version {WEBSOCKET_VERSION} is spoken (Sec-WebSocket-Version)",
            "Sec-WebSocket-Version",
            426 if version else 400,
        )
    if not _valid_nonce(headers.get("Sec-WebSocket-Key", "")):
        raise handshake_error(
            "Sec-WebSocket-Key must be 16 bytes in base64 (RFC 6455)", "Sec-WebSocket-Key"
        )


def _valid_nonce(key: str) -> bool:
    try:
        return len(base64.b64decode(key.strip().encode("ascii"), validate=True)) == NONCE_BYTES
    except (UnicodeEncodeError, binascii.Error):
        return False


class BoundedServer(Server):  # type: ignore[misc]
    """simple_websocket's server, dropping what the client sends within bounds (see module)."""

    # The library's own state, which the bounds read and reset.
    connected: bool
    input_buffer: list[str | bytes]
    incoming_message: str | bytes | bytearray | None
    incoming_message_len: int

    def __init__(
        self, environ: dict[str, Any], *, max_message_bytes: int, budget_bytes: int, **options: Any
    ):
        self.max_message_bytes = max_message_bytes
        self.budget_bytes = budget_bytes
        self.inbound_bytes = 0
        self.closing_since: float | None = None
        self.lingered_bytes = 0
        super().__init__(environ, **options)

    def _handle_events(self) -> bool:
        """The library's event handling, then the bounds: runs in the reader thread after each
        read (at most ``receive_bytes``), so no more than one read's messages are ever held."""
        keep_going: bool = super()._handle_events()
        sizes = [
            len(message.encode() if isinstance(message, str) else message)
            for message in self.input_buffer
        ]
        self.input_buffer.clear()
        dropped = sum(sizes)
        self.inbound_bytes += dropped
        if self.closing_since is not None:
            # Closing: the partial message is dropped too, and the linger has its bounds.
            self.lingered_bytes += dropped + self.incoming_message_len
            self.incoming_message, self.incoming_message_len = None, 0
            return (
                keep_going
                and self.lingered_bytes <= CLOSE_LINGER_BYTES
                and time.monotonic() - self.closing_since < CLOSE_LINGER_SECONDS
            )
        if not keep_going:
            return False
        largest = max(sizes, default=0)
        if max(largest, self.incoming_message_len) > self.max_message_bytes:
            self._refuse(CloseReason.MESSAGE_TOO_BIG, "message too big")
        elif self.inbound_bytes > self.budget_bytes:
            self._refuse(CloseReason.POLICY_VIOLATION, "this stream takes no input")
        return True

    def _refuse(self, code: CloseReason, reason: str) -> None:
        """Send the close frame and keep reading (dropping) until the client's close arrives."""
        received = self.inbound_bytes + self.incoming_message_len
        log.info("websocket closed %s: %s (%d bytes in)", int(code), reason, received)
        self.incoming_message, self.incoming_message_len = None, 0
        self.closing_since = time.monotonic()
        self.close_reason, self.close_message = code, reason
        try:
            self.sock.send(self.ws.send(CloseConnection(code, reason)))
        except (OSError, LocalProtocolError):
            self.connected = False
        self.event.set()

    @property
    def is_open(self) -> bool:
        """Still a socket to write to: neither side has closed it or begun to."""
        return bool(self.connected) and self.closing_since is None

    def send(self, data: str | bytes) -> None:
        """As the library's, but a socket that is closing is closed, for the writer too."""
        if self.closing_since is not None:
            raise ConnectionClosed(self.close_reason, self.close_message)
        try:
            super().send(data)
        except LocalProtocolError as exc:
            raise ConnectionClosed(self.close_reason, self.close_message) from exc

    def close(self, reason: int | None = None, message: str | None = None) -> None:
        if self.closing_since is not None:
            raise ConnectionClosed(self.close_reason, self.close_message)
        try:
            super().close(reason, message)
        except LocalProtocolError as exc:
            raise ConnectionClosed(self.close_reason, self.close_message) from exc

    def finish(self) -> None:
        """Close (if nobody has) and give the client up to ``CLOSE_LINGER_SECONDS`` to answer
        with its own close frame before the server drops the connection."""
        if self.closing_since is None:
            with contextlib.suppress(ConnectionClosed, OSError):
                self.close()
            self.closing_since = time.monotonic()
        self.thread.join(CLOSE_LINGER_SECONDS)


def upgrade() -> BoundedServer:
    """Check the handshake, then upgrade; a request the protocol library still refuses is a
    400 (nothing has been written to the socket yet)."""
    check_handshake()
    web = services().settings.web
    try:
        return BoundedServer(
            request.environ,
            max_message_bytes=web.ws_max_message_bytes,
            budget_bytes=web.ws_inbound_budget_bytes,
            ping_interval=web.keepalive_seconds,
        )
    except (RemoteProtocolError, LocalProtocolError, HandshakeIncomplete, ValueError) as exc:
        raise handshake_error(f"invalid WebSocket handshake: {exc}", "handshake") from None


def websocket_view(handler: Handler) -> Callable[..., Response]:
    """A Flask view that upgrades, runs ``handler(ws, **view_args)`` and closes."""

    def view(**view_args: Any) -> Response:
        ws = upgrade()
        try:
            handler(ws, **view_args)
        except ConnectionClosed:
            pass
        finally:
            ws.finish()
        return _handled_response(ws.mode)

    view.__name__ = handler.__name__
    view.__doc__ = handler.__doc__
    return view


def _handled_response(mode: str) -> Response:
    """The socket is the WebSocket's now: tell the server not to write an HTTP response."""

    class UpgradedResponse(Response):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            if mode == "gunicorn":
                raise StopIteration()  # gunicorn: close the connection, write nothing
            if mode == "werkzeug":
                return super().__call__(*args, **kwargs)
            return []

    return UpgradedResponse()
