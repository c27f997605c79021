"""The two programs share a contract, not code: web never loads CTranslate2, worker never web."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from worker.config import PROJECT_ROOT


def test_the_web_tier_never_imports_ctranslate2() -> None:
    probe = (
        "import sys, web, web.openai_api, web.batches, web.stream, web.metrics, web.page;"
        "import web.scaling, web.health;"
        "print('ctranslate2' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"


def test_the_worker_never_imports_the_web_tier() -> None:
    offenders = [
        str(path)
        for path in Path(PROJECT_ROOT, "worker").glob("*.py")
        if any(
            line.startswith(("from web", "import web")) for line in path.read_text().splitlines()
        )
    ]
    assert offenders == []
