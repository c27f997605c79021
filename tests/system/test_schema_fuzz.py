"""Fuzz every operation of /openapi.json with schemathesis (positive and negative cases)
against a real stack: zero 5xx, zero undocumented statuses, zero schema-violating responses."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faultstack import FaultStack, build_fault_stack
from tests.server_log import server_faults

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
    ]
)


@pytest.fixture(scope="module")
def fuzz_stack(
    tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path
) -> Iterator[FaultStack]:
    stack = build_fault_stack(
        tmp_path_factory.mktemp("fuzz"),
        models_toml=f'[models.demo]\npath = "{demo_model_dir}"\n',
        settings_toml=(
            "[limits]\nmax_tokens_ceiling = 32\ndefault_max_tokens = 8\nmax_queued_jobs = 200\n"
        ),
    )
    stack.worker("fuzz", ("demo",))
    yield stack
    stack.close()


@pytest.mark.timeout(300)  # about 30 s alone; schemathesis itself stops at 240 s
def test_every_operation_survives_fuzzing(fuzz_stack: FaultStack, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "st"),
            "run",
            f"{fuzz_stack.web_url}/openapi.json",
            "--checks", CHECKS,
            "--phases", "examples,coverage,fuzzing",
            "--max-examples", "15",
            "--seed", "20261130",
            "--request-timeout", "120",
            "--workers", "1",  # CPython 3.11 can hit an AST SystemError compiling in threads
            "--generation-database", "none",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )  # fmt: skip
    summary = result.stdout[-4000:]
    assert result.returncode == 0, summary + result.stderr[-2000:]
    assert "Tested: 26" in summary  # every operation of the document was exercised
    assert "Stateful" in summary  # sequences along the links ran too
    web_log = (fuzz_stack.log_dir / "web.log").read_text("utf-8", "replace")
    assert server_faults(web_log) == []
