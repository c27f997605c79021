"""Responses API events: numbered from the token log, deltas rendered from a per-stream template
exactly as json.dumps writes them, and chat templates that refuse a conversation."""

from __future__ import annotations

import json

import pytest

from trickle.events import TokenEvent, encode_text
from trickle.jobs import FinishReason, Job, JobStatus
from trickle.params import GenerationParams
from web.common.chat_template import ChatTurn, render_chat
from web.common.errors import HttpError
from web.openai.responses_api.render import (
    HEAD_EVENTS,
    DeltaTemplate,
    delta_event,
    head_events,
    tail_events,
)
from web.openai.responses_api.store import StoredResponse
from web.streams.sse_events import typed_event

RECORD = StoredResponse(
    id="resp_" + "a" * 32,
    job_id="job_" + "a" * 32,
    tenant_digest="",
    model="demo",
    created_at=1,
    messages=(ChatTurn("user", "hi"),),
)


@pytest.mark.parametrize("texts", [["a"], ["", 'q"u\\o', "\u00e9\n", "\x00"]])
def test_delta_template_writes_what_json_dumps_writes(texts: list[str]) -> None:
    rendered = DeltaTemplate(RECORD).render(5, [encode_text(t) for t in texts])
    events = [json.loads(b.split("data: ", 1)[1]) for b in rendered.split("\n\n") if b]
    assert [e["sequence_number"] for e in events] == [
        HEAD_EVENTS + 5 + i for i in range(len(texts))
    ]
    assert [e["delta"] for e in events] == texts
    plain = "".join(
        delta_event(RECORD, TokenEvent(RECORD.job_id, 5 + i, t)).replace(
            '"logprobs": [{"token": ' + encode_text(t) + ', "logprob": 0.0, "top_logprobs": []}]',
            '"logprobs": []',
        )
        for i, t in enumerate(texts)
    )
    assert rendered == plain


def test_the_sequence_is_numbered_from_the_log() -> None:
    job = Job(RECORD.job_id, "demo", "hi", GenerationParams(), status=JobStatus.SUCCEEDED)
    job.output, job.finish_reason = "abc", FinishReason.LENGTH
    head = head_events(RECORD)
    tail = tail_events(RECORD, job, 3, None)
    assert [e["sequence_number"] for e in head + tail] == [0, 1, 2, 3, 7, 8, 9, 10]
    assert tail[-1]["type"] == "response.incomplete"
    assert tail[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert typed_event(tail[0]).startswith("event: response.output_text.done\ndata: {")


def test_a_template_may_refuse_the_conversation() -> None:
    template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(HttpError) as refused:
        render_chat([ChatTurn("user", "x")], template, param="input")
    assert refused.value.param == "input" and "roles must alternate" in refused.value.message
