"""Custom ``format``s a schema named, told to the client: ``Trickle-Unchecked-Formats`` on the
answer. JSON Schema makes a format no specification defines an annotation (a validator that
does not know it passes every instance), so Trickle serves such a schema with the format left
unenforced (``trickle.formats``) instead of refusing it; this header says which were, so
none is ignored silently. A batch line has no headers of its own: docs/structured-output.md."""

from __future__ import annotations

from urllib.parse import quote

from flask import Flask, Response, g, has_app_context

from trickle.formats import unchecked_formats

UNCHECKED_FORMATS_HEADER = "Trickle-Unchecked-Formats"


def note_unchecked_formats(schema: object) -> None:
    """Remember the custom formats of a schema this request's grammar serves."""
    names = unchecked_formats(schema)
    if names and has_app_context():
        g.unchecked_formats = sorted({*g.get("unchecked_formats", ()), *names})


def header_value(names: list[str]) -> str:
    """The names, each percent-encoded (UTF-8; a client's format may hold any character,
    ``,``, CR or LF included, none of which a header may carry as they are), ``, ``-joined."""
    return ", ".join(quote(name, safe="") for name in names)


def install_unchecked_formats(app: Flask) -> None:
    """Every answer whose request's schemas named custom formats carries the header."""

    @app.after_request
    def tell(response: Response) -> Response:
        names = g.get("unchecked_formats")
        if names:
            response.headers[UNCHECKED_FORMATS_HEADER] = header_value(names)
        return response
