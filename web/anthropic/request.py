"""A ``POST /v1/messages`` (or ``count_tokens``) body to a prompt and generation parameters.

What the schema cannot say is checked here, first, so the error names the thing the client got
wrong: a role other than user or assistant, a block type other than text (tool use, images and
documents are not served yet). Consecutive turns of one role are one turn, as Anthropic combines
them; a conversation that ends with an assistant turn is continued from that turn's text (a
prefill), so the answer holds only what follows it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from flask import request

from trickle.config.settings import Settings
from trickle.jobs import GenerationParams
from web.anthropic.models import (
    VERSION_PATTERN,
    AnthropicTextBlock,
    CountTokensRequest,
    MessagesRequest,
)
from web.chat_template import ChatTurn
from web.errors import invalid
from web.openai.requests import chat_prompt
from web.validation import served_model, validate

ROLES = ("user", "assistant")
NO_TOOL = ("auto", "none")  # the tool choices that call no tool
VERSION_HEADER = "anthropic-version"


@dataclass(frozen=True)
class MessagesCall:
    """A validated message request: the prompt the model reads and how to sample it."""

    model: str
    prompt: str
    params: GenerationParams
    stream: bool


def check_version() -> None:
    """``anthropic-version`` is optional; one that is not a date is refused."""
    version = request.headers.get(VERSION_HEADER)
    if version is not None and not re.fullmatch(VERSION_PATTERN, version):
        raise invalid(VERSION_HEADER, f"{VERSION_HEADER}: {version!r} is not a date (2023-06-01)")


def parse_messages(body: Any, settings: Settings, model: type[MessagesRequest]) -> MessagesCall:
    refuse_unsupported(body)
    req = validate(model, body)
    name = served_model(req.model, settings)
    params = GenerationParams(
        max_tokens=req.max_tokens,
        temperature=1.0 if req.temperature is None else float(req.temperature),
        top_k=req.top_k or 0,
        top_p=1.0 if req.top_p is None else float(req.top_p),
        stop=tuple(req.stop_sequences or ()),
    )
    return MessagesCall(name, prompt_of(req, settings, name), params, bool(req.stream))


def parse_count(body: Any, settings: Settings, model: type[CountTokensRequest]) -> tuple[str, str]:
    """The served model and the prompt a message with this body would have."""
    refuse_unsupported(body)
    req = validate(model, body)
    name = served_model(req.model, settings)
    return name, prompt_of(req, settings, name)


def prompt_of(req: CountTokensRequest, settings: Settings, model: str) -> str:
    """The conversation through the model's chat template; a final assistant turn is
    continued, not closed."""
    turns = _merged([ChatTurn(m.role, _text(m.content)) for m in req.messages])
    system = _text(req.system) if req.system is not None else ""
    head = [ChatTurn("system", system)] if system else []
    if turns[-1].role == "assistant":
        prefill = turns.pop()
        return chat_prompt([*head, *turns], settings, model) + prefill.content
    return chat_prompt([*head, *turns], settings, model)


def _text(content: str | list[AnthropicTextBlock]) -> str:
    return content if isinstance(content, str) else "".join(block.text for block in content)


def _merged(turns: list[ChatTurn]) -> list[ChatTurn]:
    merged: list[ChatTurn] = []
    for turn in turns:
        if merged and merged[-1].role == turn.role:
            merged[-1] = ChatTurn(turn.role, f"{merged[-1].content}\n\n{turn.content}")
        else:
            merged.append(turn)
    return merged


def refuse_unsupported(body: Any) -> None:
    """Roles and block types the Messages API has but Trickle does not serve, by name."""
    if not isinstance(body, dict):
        return  # validate() says the body must be an object
    if body.get("tools") not in (None, []):
        raise invalid("tools", "tools: tool use is not supported yet (only an empty list)")
    choice = body.get("tool_choice")
    if choice is not None and not (isinstance(choice, dict) and choice.get("type") in NO_TOOL):
        raise invalid(
            "tool_choice",
            "tool_choice: only {'type': 'auto'} or {'type': 'none'} (no tools are served)",
        )
    system = body.get("system")
    if isinstance(system, list):
        _check_blocks(system, "system")
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if isinstance(role, str) and role not in ROLES:
            hint = " (put it in the top-level system field)" if role == "system" else ""
            raise invalid(
                f"messages[{index}].role",
                f"messages[{index}].role: unexpected role {role!r}; "
                f"only 'user' and 'assistant' are accepted{hint}",
            )
        content = message.get("content")
        if isinstance(content, list):
            _check_blocks(content, f"messages[{index}].content")


def _check_blocks(blocks: list[Any], where: str) -> None:
    for index, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if isinstance(kind, str) and kind != "text":
            param = f"{where}[{index}].type"
            raise invalid(
                param, f"{param}: content block type {kind!r} is not supported (only 'text')"
            )
