"""JSON for the errors gunicorn answers itself (a bad request line, 414, 431, bad chunking).

Those requests never reach Flask, so ``web.common.errors`` cannot shape them; gunicorn writes them
with ``gunicorn.util.write_error``, which this replaces (at config load, before workers fork) with a
writer of the same ``{"error": {...}}`` body every other Trickle error has.
"""

from __future__ import annotations

import json
import socket

from gunicorn import util

ERROR_TYPES = {
    400: "invalid_request_error",
    403: "forbidden",
    414: "request_too_large",
    417: "invalid_request_error",
    431: "request_too_large",
    501: "not_implemented",
}


def write_json_error(sock: socket.socket, status_int: int, reason: str, mesg: str) -> None:
    kind = ERROR_TYPES.get(status_int, "internal_error" if status_int >= 500 else "http_error")
    error = {"message": mesg or reason, "type": kind, "param": None, "code": None}
    body = json.dumps({"error": error}).encode()
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    util.write_nonblock(sock, head.encode("latin-1") + body)


def install() -> None:
    util.write_error = write_json_error
