"""The hops tile arrival to first token: their sum is the time to first token, exactly."""

from __future__ import annotations

from trickle.hop_timings import FIRST_TOKEN_HOPS, hop_seconds, server_timing
from trickle.jobs import Job
from trickle.params import GenerationParams


def job_at(**moments: float) -> Job:
    return Job(id="job_" + "0" * 32, model="demo", prompt="", params=GenerationParams(), **moments)


def test_the_first_token_hops_add_up_to_the_time_to_first_token() -> None:
    job = job_at(
        arrived_at=100.0,
        created_at=100.0021,
        started_at=100.5,
        claimed_at=100.5013,
        first_token_at=100.73,
        completed_at=101.9,
    )
    hops = job.hops()
    assert tuple(hops) == (*FIRST_TOKEN_HOPS, "generate")
    ttft = job.metrics()["time_to_first_token_seconds"]
    assert ttft is not None
    assert abs(sum(hops[name] for name in FIRST_TOKEN_HOPS) - ttft) < 1e-6
    assert abs(hops["generate"] - 1.17) < 1e-9


def test_a_hop_not_reached_is_left_out_and_none_is_negative() -> None:
    queued = hop_seconds(None, 10.0, None, None, None, None)
    assert queued == {}
    resumed = hop_seconds(9.0, 10.0, 11.0, 30.0, 20.0, 31.0)  # a second attempt's claim
    assert resumed["prefill"] == 0.0 and min(resumed.values()) >= 0.0


def test_server_timing_is_w3c_syntax_in_milliseconds() -> None:
    value = server_timing({"admit": 0.0012, "queue": 0.25, "deliver": 0.0000004})
    assert value == "admit;dur=1.200, queue;dur=250.000, deliver;dur=0.000"


def test_the_hops_survive_the_job_hash() -> None:
    job = job_at(arrived_at=5.5, created_at=5.75)
    fields = job.to_hash()
    assert Job.from_hash(fields).arrived_at == 5.5
    assert job.to_dict()["timings"] == {"admit": 250.0}


def test_a_job_that_ended_unclaimed_waited_in_the_queue_until_its_end() -> None:
    # Expired at its deadline by a sweep or a reader: never claimed, no hop past the queue.
    expired = job_at(arrived_at=100.0, created_at=100.25, completed_at=101.5)
    assert expired.to_dict()["timings"] == {"admit": 250.0, "queue": 1250.0}
    assert expired.metrics()["queue_seconds"] == 1.25
    assert expired.metrics()["time_to_first_token_seconds"] is None
