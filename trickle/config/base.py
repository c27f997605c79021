"""The base of every configuration table, shared by the product keys and the tuning knobs."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ConfigDict


@dataclass(frozen=True)
class Section:
    """A configuration section: unknown keys are errors, in the file and the environment alike
    (a typo must not pass silently)."""

    __pydantic_config__ = ConfigDict(extra="forbid")
