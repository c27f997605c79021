"""Stored Responses API responses: what a response adds to its job, one JSON string each.

A response is a job: the job holds the text, status, usage and token log. The record keeps
what the job does not know: the conversation (for ``previous_response_id``), the request fields
the response object echoes, and the tenant. It expires no later than its job could (queued for
``queued_ttl_seconds``, then kept ``result_ttl_seconds``); a record whose job is gone reads as
expired.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from trickle import keys
from web.common.chat_template import ChatTurn, TurnCall
from web.common.tools.definitions import Choice, ToolUse

RESPONSE_ID_PATTERN = re.compile(r"resp_[0-9a-f]{32}")


def response_id_for(job_id: str) -> str:
    """``job_<hex>`` -> ``resp_<hex>``: a response is named after its job."""
    return "resp_" + job_id.removeprefix("job_")


def is_response_id(value: str) -> bool:
    """Whether ``value`` can name a response (anything else never becomes part of a key)."""
    return RESPONSE_ID_PATTERN.fullmatch(value) is not None


@dataclass(frozen=True)
class StoredResponse:
    """A response's record: the job it runs as, and what its object echoes."""

    id: str
    job_id: str
    tenant_digest: str
    model: str
    created_at: int
    # The whole conversation up to this response's input (previous turns included); the
    # instructions are not carried from turn to turn, as OpenAI does.
    messages: tuple[ChatTurn, ...]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    metadata: dict[str, str] = field(default_factory=dict)
    previous_response_id: str | None = None
    background: bool = False
    store: bool = True
    logprobs: bool = False  # include: ["message.output_text.logprobs"]
    top_logprobs: int = 0
    parallel_tool_calls: bool = True
    tool_choice: Choice = "auto"
    # The function tools as the object echoes them, and the parser that reads the answer
    # (None: no tools, or tool_choice none).
    tools: tuple[dict[str, Any], ...] = ()
    tool_parser: str | None = None
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})

    @property
    def item_id(self) -> str:
        """The id of its one output message."""
        return "msg_" + self.id.removeprefix("resp_")

    def tool_use(self) -> ToolUse | None:
        """The tools as the template and the parser take them (None: the answer is text)."""
        if not self.tools:
            return None
        definitions = tuple(
            {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
            for tool in self.tools
        )
        return ToolUse(definitions, self.tool_parser, None if self.parallel_tool_calls else 1)

    def to_json(self) -> str:
        data = asdict(self)
        data["messages"] = [_turn_json(m) for m in self.messages]
        return json.dumps(data, ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: str) -> StoredResponse:
        data: dict[str, Any] = json.loads(raw)
        data["messages"] = tuple(_turn(item) for item in data["messages"])
        data["tools"] = tuple(data.get("tools", ()))
        return cls(**data)


def _turn_json(turn: ChatTurn) -> list[Any]:
    """``[role, content]``, with the turn's calls and the call it answers when it has them."""
    if not turn.tool_calls and turn.tool_call_id is None:
        return [turn.role, turn.content]
    calls = [[c.id, c.name, c.arguments] for c in turn.tool_calls]
    return [turn.role, turn.content, calls, turn.tool_call_id]


def _turn(item: list[Any]) -> ChatTurn:
    if len(item) == 2:
        return ChatTurn(item[0], item[1])
    role, content, calls, answered = item
    return ChatTurn(role, content, tuple(TurnCall(*call) for call in calls), answered)


class ResponseStore:
    def __init__(self, client: redis.Redis, ttl_seconds: int):
        self._redis = client
        self._ttl = ttl_seconds

    def save(self, record: StoredResponse) -> None:
        self._redis.set(keys.response(record.id), record.to_json(), ex=self._ttl)

    def load(self, response_id: str) -> StoredResponse | None:
        if not is_response_id(response_id):
            return None
        raw = self._redis.get(keys.response(response_id))
        return None if raw is None else StoredResponse.from_json(str(raw))

    def delete(self, response_id: str) -> bool:
        return bool(self._redis.delete(keys.response(response_id)))

    def token_count(self, job_id: str) -> int:
        """How many tokens the job's replay log holds (its stream's delta events)."""
        return int(self._redis.llen(keys.job_tokens(job_id)))
