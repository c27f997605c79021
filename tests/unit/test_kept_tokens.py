"""What the publisher keeps to restore a replay log Redis lost (pure bookkeeping, no Redis)."""

from __future__ import annotations

from trickle.events import TokenEvent
from trickle.job_result import JobResult
from trickle.jobs import FinishReason, JobStatus
from worker.kept_tokens import KEEP_FINISHED_SECONDS, KeptTokens
from worker.publish_items import FinishItem, TokenItem


def flush(job_id: str, first: int, count: int) -> list[TokenItem]:
    return [TokenItem(TokenEvent(job_id, i, f"<{i}>"), "w:1") for i in range(first, first + count)]


def finish(job_id: str) -> FinishItem:
    return FinishItem(job_id, "w:1", JobResult(JobStatus.SUCCEEDED, "", FinishReason.LENGTH, 6, 0))


def test_the_count_a_final_state_needs_is_one_past_the_last_token_sent() -> None:
    kept = KeptTokens()
    assert kept.count("a") == 0
    kept.add([flush("a", 0, 2), flush("b", 0, 1)])
    kept.add([flush("a", 2, 4)])
    assert kept.count("a") == 6 and kept.count("b") == 1


def test_what_a_log_lost_comes_back_in_order_from_its_length() -> None:
    kept = KeptTokens()
    kept.add([flush("a", 0, 2)])
    kept.add([flush("a", 2, 4)])
    missing = kept.missing("a", 1)
    assert missing is not None and [t.event.index for t in missing] == [1, 2, 3, 4, 5]


def test_tokens_an_earlier_run_sent_cannot_be_restored() -> None:
    kept = KeptTokens()
    kept.add([flush("a", 4, 2)])  # a resumed run: it began at 4
    assert kept.missing("a", 2) is None
    assert kept.count("a") == 0  # given up: its final state no longer waits


def test_a_stored_final_state_is_kept_then_expires() -> None:
    kept = KeptTokens()
    kept.add([flush("a", 0, 6)])
    kept.stored(finish("a"), True, now=100.0)
    assert kept.count("a") == 0  # no longer sending: nothing to wait for
    kept.expire(100.0 + KEEP_FINISHED_SECONDS - 1)
    (again,) = kept.finished_again()
    assert again.job_id == "a" and kept.count("a") == 6  # its tokens ready for a repair
    kept.stored(again, True, now=200.0)
    kept.expire(200.0 + KEEP_FINISHED_SECONDS + 1)
    assert kept.finished_again() == []


def test_a_job_running_here_again_is_not_finished_again_nor_a_refused_one_kept() -> None:
    kept = KeptTokens()
    kept.add([flush("a", 0, 6), flush("b", 0, 6)])
    kept.stored(finish("a"), True, now=1.0)
    kept.stored(finish("b"), False, now=1.0)  # fenced out: not this worker's
    kept.add([flush("a", 6, 1)])  # claimed anew by this worker, running
    assert kept.finished_again() == []
    assert kept.count("a") == 7
