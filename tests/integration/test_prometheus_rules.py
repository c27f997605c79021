"""deploy/prometheus/rules.yml (the TTFT p99 budget and the hop that breaks it) under
Prometheus's own rule tester, ``promtool test rules``, and its metric names against the ones
Trickle exports. CI installs promtool (Debian's ``prometheus``, .ci/run): there a missing
promtool fails the test; elsewhere it skips."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from trickle.hop_timings import FIRST_TOKEN_HOPS
from trickle.telemetry.metric_defs import HOP_TIME, TIME_TO_FIRST_TOKEN

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail("promtool is missing: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return found


def test_the_budget_rules_pass_their_promtool_tests() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", "rules_test.yml"],
        cwd=RULES,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_rules_read_the_metrics_trickle_exports() -> None:
    text = (RULES / "rules.yml").read_text()
    read = set(re.findall(r"\b(trickle_[a-z_]+)_bucket\b", text))
    assert read == {TIME_TO_FIRST_TOKEN.name, HOP_TIME.name}
    for hop in FIRST_TOKEN_HOPS:
        assert hop in HOP_TIME.help
