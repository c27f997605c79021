"""AdmissionWindow: a lone job after a quiet spell starts at once; jobs that arrive close
together wait the configured window for company."""

from __future__ import annotations

import time

from worker.engine.admission_window import AdmissionWindow


def test_a_lone_job_after_a_quiet_spell_waits_for_nobody() -> None:
    window = AdmissionWindow(max_batch_wait_ms=20, quiet_start_after_ms=1)
    window.arrived()
    time.sleep(0.005)
    window.arrived()
    assert window.seconds(waiting=1) == 0.0


def test_jobs_arriving_close_together_wait_the_window() -> None:
    window = AdmissionWindow(max_batch_wait_ms=20, quiet_start_after_ms=10_000)
    window.arrived()
    window.arrived()
    assert window.seconds(waiting=1) == 0.02


def test_a_lane_that_finds_company_waits_the_window_whatever_the_gap() -> None:
    window = AdmissionWindow(max_batch_wait_ms=20, quiet_start_after_ms=1)
    window.arrived()
    time.sleep(0.005)
    window.arrived()
    assert window.seconds(waiting=2) == 0.02


def test_without_a_quiet_start_every_job_waits_the_window() -> None:
    window = AdmissionWindow(max_batch_wait_ms=20)
    window.arrived()
    assert window.seconds(waiting=1) == 0.02
