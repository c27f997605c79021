"""The two programs share a contract, not code: web never loads CTranslate2, worker never web.

The layers themselves are import-linter contracts in pyproject.toml (run by ``make lint``);
this test checks what a static graph cannot: that importing the web tier at run time (lazy and
indented imports included) never loads CTranslate2.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from trickle.config.settings import PROJECT_ROOT


def test_the_web_tier_never_imports_ctranslate2() -> None:
    probe = (
        "import sys, web, web.openai.routes, web.openai.responses_api.routes, web.batches.routes;"
        "import web.streams.routes, web.operations.metrics, web.page, web.operations.scaling;"
        "import web.operations.health, web.api_schema;"
        "print('ctranslate2' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"


def test_the_import_contracts_hold() -> None:
    lint = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PROJECT_ROOT,
    )
    assert lint.returncode == 0, lint.stdout[-3000:]
    assert "0 broken" in lint.stdout
