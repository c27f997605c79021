"""Markdown table pieces the bench reports share: a number's cell, a percentile's value from a
measured section, and a table with its first column left-aligned and the figures right."""

from __future__ import annotations

from typing import Any


def fmt(value: float | int | None, digits: int = 0, suffix: str = "") -> str:
    """``value`` with thousands separators and ``digits`` decimals; "-" when not measured."""
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{suffix}"


def stat(section: dict[str, Any] | None, key: str, which: str) -> float | None:
    """``section[key][which]`` (e.g. ``ttft_ms``, ``p50``), or None when not measured."""
    if not section:
        return None
    value = (section.get(key) or {}).get(which)
    return None if value is None else float(value)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    align = ["---"] + ["--:"] * (len(header) - 1)
    return [_row(header), _row(align), *(_row(r) for r in rows)]
