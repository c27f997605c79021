"""The lock files agree with pyproject.toml: every range is locked, and every lock line is hashed.

`make up` and `make test` install requirements/runtime.txt and requirements/dev.txt exactly
(`make lock` writes them). A dependency added to pyproject.toml without `make lock` would be
missing on a fresh machine; this fails first, naming it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PINNED = re.compile(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)")


def locked_versions(lock: Path) -> dict[str, list[str]]:
    """Each locked package and its versions (a universal lock may pin one per Python)."""
    versions: dict[str, list[str]] = {}
    for line in lock.read_text().splitlines():
        if match := PINNED.match(line):
            versions.setdefault(canonicalize_name(match[1]), []).append(match[2])
    return versions


def declared(extra: str | None) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = project["dependencies"] + (project["optional-dependencies"][extra] if extra else [])
    return [Requirement(name) for name in names]


@pytest.mark.parametrize(
    ("lock", "extra"), [("requirements/runtime.txt", None), ("requirements/dev.txt", "dev")]
)
def test_every_declared_range_is_locked_within_it(lock: str, extra: str | None) -> None:
    versions = locked_versions(ROOT / lock)
    for requirement in declared(extra):
        name = canonicalize_name(requirement.name)
        assert name in versions, f"{requirement.name} is not in {lock}: run `make lock`"
        for version in versions[name]:
            assert requirement.specifier.contains(version, prereleases=True), (
                f"{lock} pins {name}=={version} outside {requirement}: run `make lock`"
            )


def test_the_runtime_lock_is_the_dev_lock_less_the_dev_tools() -> None:
    runtime = locked_versions(ROOT / "requirements/runtime.txt")
    dev = locked_versions(ROOT / "requirements/dev.txt")
    for name, pinned in runtime.items():
        assert dev.get(name) == pinned, f"{name}: runtime {pinned}, dev {dev.get(name)}"


@pytest.mark.parametrize("lock", ["requirements/runtime.txt", "requirements/dev.txt"])
def test_every_locked_package_carries_its_hashes(lock: str) -> None:
    text = (ROOT / lock).read_text()
    entries = re.split(r"\n(?=[A-Za-z0-9_.-]+==)", text.split("\n", 2)[2])
    assert len(entries) > 20
    for entry in entries:
        assert "--hash=sha256:" in entry, f"{lock}: no hash for {entry.splitlines()[0]}"
