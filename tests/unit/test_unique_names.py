"""No public top-level name twice in web/, worker/ and trickle/: one name per concept, so a
name found in a traceback, a grep or an import means one thing (issue 51)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("web", "worker", "trickle")
# Every module's own by convention: its logger, its Flask blueprint, and a Celery app module's
# ``app`` (what ``celery -A module`` looks for).
CONVENTIONAL = {"log", "blueprint", "app"}


def _is_type_var(value: ast.expr | None) -> bool:
    """A TypeVar is a placeholder local to its module's signatures, not a concept."""
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id in ("TypeVar", "ParamSpec")
    )


def _top_level_names(tree: ast.Module) -> list[str]:
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign) and not _is_type_var(node.value):
            names += [target.id for target in node.targets if isinstance(target, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names += [] if _is_type_var(node.value) else [node.target.id]
    return [n for n in names if not n.startswith("_") and n not in CONVENTIONAL]


def definitions() -> dict[str, list[str]]:
    """Each public top-level name over the packages, with the modules that define it."""
    found: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for name in _top_level_names(tree):
                found[name].append(path.relative_to(ROOT).as_posix())
    return found


def test_no_public_top_level_name_is_defined_twice() -> None:
    twice = {name: paths for name, paths in definitions().items() if len(paths) > 1}
    assert twice == {}, f"rename each apart, or import the one: {twice}"


def test_private_names_type_vars_loggers_and_blueprints_are_left_out() -> None:
    tree = ast.parse("T = TypeVar('T')\nlog = 1\nLIMIT = 2\ndef run(): ...\nclass _Hidden: ...\n")
    assert _top_level_names(tree) == ["LIMIT", "run"]
