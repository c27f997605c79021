"""Key names that moved, still read at their old place for one release, with a warning.

The tuning knobs left the product sections for ``[tuning]`` and ``[models.<name>.tuning]``
(``trickle.config.tuning``). A configuration written for the old layout keeps working: each old
key, in the file or the environment, is moved to its new place before validation, and the
operator is told once per key what to write instead. A key given under both names in one layer
is an error, since either choice would silently drop a value the operator wrote.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from trickle.config.tuning import ModelTuning

log = logging.getLogger(__name__)

# The section each process-wide knob used to live in.
OLD_GLOBAL_SECTIONS: dict[str, str] = {
    "publish_interval_ms": "worker",
    "publish_max_messages_per_second": "worker",
    "publish_max_interval_ms": "worker",
    "gil_switch_interval_ms": "worker",
    "share_lag_tokens": "worker",
    "stream_flush_interval_ms": "web",
}
MODEL_KNOBS = frozenset(field.name for field in dataclasses.fields(ModelTuning))


class RenameConflict(ValueError):
    """A knob is set under its old and its new name in the same layer."""


def move_file_keys(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """Move old keys of a TOML-shaped mapping to their new tables, in place; the (old, new)
    key paths moved, for ``warn``."""
    moved: list[tuple[str, str]] = []
    for key, section in OLD_GLOBAL_SECTIONS.items():
        table = raw.get(section)
        if isinstance(table, dict) and key in table:
            tuning = raw.setdefault("tuning", {})
            moved.append(_move(table, key, tuning, f"{section}.{key}", f"tuning.{key}"))
    models = raw.get("models")
    tables = models.items() if isinstance(models, dict) else ()
    for name, table in tables:
        for key in sorted(MODEL_KNOBS & table.keys()) if isinstance(table, dict) else ():
            tuning = table.setdefault("tuning", {})
            old, new = f"models.{name}.{key}", f"models.{name}.tuning.{key}"
            moved.append(_move(table, key, tuning, old, new))
    return moved


def move_env_names(
    env: Mapping[str, str], prefix: str
) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """``env`` with old ``PREFIX<SECTION>__<KEY>`` names under their new ones; the (old, new)
    names moved, for ``warn``."""
    renamed = dict(env)
    moved: list[tuple[str, str]] = []
    for name in env:
        new = _new_env_name(name.upper(), prefix)
        if new is None:
            continue
        if any(other.upper() == new for other in env):
            raise RenameConflict(f"{name} and {new} are both set: keep only {new}")
        renamed[new] = renamed.pop(name)
        moved.append((name, new))
    return renamed, moved


def warn(moved: list[tuple[str, str]]) -> None:
    """One warning per old key, naming the key that replaces it."""
    for old, new in moved:
        log.warning("config: %s is deprecated and will be removed; set %s instead", old, new)


def _move(table: dict[str, Any], key: str, tuning: Any, old: str, new: str) -> tuple[str, str]:
    if not isinstance(tuning, dict):
        raise RenameConflict(f"{new.rsplit('.', 1)[0]} must be a table")
    if key in tuning:
        raise RenameConflict(f"{old} and {new} are both set: keep only {new}")
    tuning[key] = table.pop(key)
    return old, new


def _new_env_name(name: str, prefix: str) -> str | None:
    if not name.startswith(prefix):
        return None
    parts = name[len(prefix) :].split("__")
    if len(parts) == 2 and OLD_GLOBAL_SECTIONS.get(parts[1].lower()) == parts[0].lower():
        return f"{prefix}TUNING__{parts[1]}"
    if len(parts) == 3 and parts[0] == "MODELS" and parts[2].lower() in MODEL_KNOBS:
        return f"{prefix}MODELS__{parts[1]}__TUNING__{parts[2]}"
    return None
