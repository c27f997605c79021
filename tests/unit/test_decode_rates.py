"""A model's recent decoding rates: a call slower than the same worker went at a comparable
load in the last minute (a burst's admission) is priced at the past pace, not its own."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from worker.decode_rates import WINDOW_SECONDS, DecodeRates, lanes_rate
from worker.engine.lane_views import LaneOpening
from worker.outlook import model_outlook


def lanes(rows: int, step: float, count: int = 4, opens: float = 0.0) -> list[LaneOpening]:
    """``count`` lanes of ``rows`` rows, each call stepping every ``step`` seconds and taking a
    newcomer in ``opens`` seconds."""
    return [
        LaneOpening(tuple(object() for _ in range(rows)), opens, step)  # type: ignore[arg-type]
        for _ in range(count)
    ]


def test_the_rate_counts_every_stepping_row() -> None:
    mixed = [*lanes(4, 0.008, 1), *lanes(2, 0.004, 1), LaneOpening((), 0.0)]
    not_stepped = LaneOpening((object(),), 0.0, 0.0)  # type: ignore[arg-type]
    assert lanes_rate([*mixed, not_stepped]) == (6, pytest.approx(1000.0))
    assert lanes_rate([]) == (0, 0.0)


def test_a_slower_present_goes_at_the_comparable_past() -> None:
    rates = DecodeRates()
    assert rates.slowdown_factor(lanes(3, 0.006), now=0.0) == 1.0  # nothing to compare with
    # 12 rows, each call stepping every 6 ms; now 16 rows at 16 ms (the burst's admission): a
    # row made 167 tokens a second and makes 62.5, so the calls go at 6 ms again.
    assert rates.slowdown_factor(lanes(4, 0.016), now=10.0) == pytest.approx(0.006 / 0.016)
    # A present faster than the past is kept as it is.
    assert rates.slowdown_factor(lanes(4, 0.004), now=11.0) == 1.0


def test_only_a_comparable_recent_load_is_compared() -> None:
    fewer = DecodeRates()
    fewer.slowdown_factor(lanes(1, 0.002), now=0.0)  # 4 rows: fewer than 3/4 of 16
    assert fewer.slowdown_factor(lanes(4, 0.016), now=1.0) == 1.0
    more = DecodeRates()
    more.slowdown_factor(lanes(5, 0.005), now=0.0)  # 20 rows: more than now
    assert more.slowdown_factor(lanes(4, 0.016), now=1.0) == 1.0
    old = DecodeRates()
    old.slowdown_factor(lanes(3, 0.006), now=0.0)
    assert old.slowdown_factor(lanes(4, 0.016), now=WINDOW_SECONDS + 1.0) == 1.0


def test_a_slowdown_that_lasts_is_believed() -> None:
    """The present joins the window: once its slow samples outnumber the comparable past's,
    the median is theirs."""
    rates = DecodeRates()
    rates.slowdown_factor(lanes(3, 0.006), now=0.0)  # 12 rows, 167 tokens a second each
    factors = [rates.slowdown_factor(lanes(4, 0.016), now=float(at)) for at in (1, 2, 3)]
    past, slow = 1 / 0.006, 1 / 0.016
    assert factors == pytest.approx([slow / past, slow / ((past + slow) / 2), 1.0])


def test_the_outlook_prices_a_slowed_call_at_the_past_pace() -> None:
    """A row with 30 tokens left in a call stepping every 16 ms, where the worker's calls
    stepped every 6 ms at a comparable load a moment ago: it ends in 30 x 6 ms, and a newcomer
    goes at 6 ms."""
    rates = DecodeRates()
    rates.slowdown_factor(lanes(3, 0.006))
    running: Any = SimpleNamespace(
        job_id="job_r",
        generated_ids=[1] * 11,
        request=SimpleNamespace(max_new_tokens=41),
        first_token_at=0.0,
        last_token_at=1.0,
        batch_started_at=0.0,
    )
    slowed = [LaneOpening((running,), 10.0, 0.016), *lanes(4, 0.016, 3, opens=10.0)]
    outlook = model_outlook([running], 1, 1.0, lambda size: None, 1.0, None, slowed, 4, rates)
    assert outlook.seconds_per_token == pytest.approx(0.006)
    assert outlook.free_in == pytest.approx((30 * 0.006,))
