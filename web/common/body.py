"""Reading request bodies: the one place that bounds size, nesting, numbers and text.

Every route that takes a body reads it here, so a limit holds whatever the framing (a chunked
body is counted as it arrives, never silently cut at the limit) and no JSON document can reach
the validators with a depth, number or string Python cannot handle (RecursionError on deep
nesting, ValueError on huge integers, UnicodeEncodeError later on lone surrogates).
"""

from __future__ import annotations

import json
from typing import Any

from flask import request
from werkzeug.exceptions import HTTPException

from web.common.errors import HttpError, invalid
from web.services import services

READ_CHUNK_BYTES = 65_536
# Deeper than any request Trickle understands (chat content parts are 4 levels), far below
# the recursion limit.
MAX_JSON_DEPTH = 32
# Digits of an integer literal: seeds fit in 19; this refuses only absurd ones, cheaply.
MAX_INTEGER_DIGITS = 64


class BadJson(ValueError):
    """The document is syntactically JSON but outside Trickle's limits; the message says how.

    ``field`` names the offending value's place in the document when it is known (a string
    with a lone surrogate: ``prompt``, ``messages[0].content``), so the error can name it.
    """

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


def too_large(limit: int) -> HttpError:
    return HttpError(413, "request_too_large", f"request body is larger than {limit} bytes", "body")


def read_body(limit: int) -> bytes:
    """The raw body whatever its Content-Type, at most ``limit`` bytes: 413 past it, with
    Content-Length or chunked alike (one byte more than the limit is read to tell)."""
    if request.content_length is not None and request.content_length > limit:
        raise too_large(limit)
    # Set before the stream exists: werkzeug then stops reading at limit + 1, which we see.
    request.max_content_length = limit + 1
    stream = request.stream
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        try:
            chunk = stream.read(min(READ_CHUNK_BYTES, limit + 1 - size))
        except HTTPException:
            raise  # 413 from werkzeug's own limit, or the client disconnecting (400)
        except Exception as exc:  # the server's framing errors (gunicorn: InvalidChunkSize...)
            raise invalid("body", f"the request body cannot be read: {exc}") from exc
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    if size > limit:
        raise too_large(limit)
    return b"".join(parts)


def decode_utf8(raw: bytes, param: str, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(param, f"{what} is not valid UTF-8 (byte {exc.start})") from exc


def parse_json(text: str) -> Any:
    """``json.loads`` within the limits; raises BadJson or json.JSONDecodeError."""
    try:
        document = json.loads(text, parse_int=_integer, parse_constant=_constant)
    except RecursionError as exc:
        raise BadJson(f"nesting deeper than {MAX_JSON_DEPTH} levels") from exc
    _check(document)
    return document


def read_json_body() -> Any:
    """The request body as JSON; every problem is a 400 (413 for size) naming the body."""
    raw = read_body(services().settings.web.max_body_bytes)
    if not raw:
        raise invalid("body", "request body must be a JSON object")
    return load_json(decode_utf8(raw, "body", "request body"), "body", "request body")


def load_json(text: str, param: str, what: str) -> Any:
    """``parse_json`` with its failures turned into a 400 naming ``param``."""
    try:
        return parse_json(text)
    except json.JSONDecodeError as exc:
        raise invalid(param, f"{what} is not valid JSON: {exc}") from exc
    except BadJson as exc:
        if exc.field:
            raise invalid(exc.field, str(exc)) from exc
        raise invalid(param, f"{what} is not acceptable JSON: {exc}") from exc


def _integer(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise BadJson(f"an integer has more than {MAX_INTEGER_DIGITS} digits")
    return int(literal)


def _constant(name: str) -> Any:
    raise BadJson(f"{name} is not a JSON number")


def _check(document: Any) -> None:
    """Depth and text, walked without recursion: every key and string must be real text."""
    stack: list[tuple[Any, int, str]] = [(document, 1, "")]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, str):
            _require_text(value, path)
        elif isinstance(value, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise BadJson(f"nesting deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(value, dict):
                for key, item in value.items():
                    _require_text(key, f"{path}.<key>" if path else "<key>")
                    stack.append((item, depth + 1, f"{path}.{key}" if path else key))
            else:
                stack.extend((item, depth + 1, f"{path}[{i}]") for i, item in enumerate(value))


def _require_text(value: str, path: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        where = path or "a string"
        message = f"{where} contains an unpaired surrogate at position {exc.start}"
        raise BadJson(message, path) from exc
