"""A ``POST /v1/messages`` (or ``count_tokens``) body to a prompt and generation parameters.

What the schema cannot say is checked here, first, so the error names the thing the client got
wrong: a role other than user or assistant, a block type the turn cannot carry (images and
documents are not served; ``tool_use`` is an assistant's, ``tool_result`` a user's), a server
tool. The turns themselves come from ``web.anthropic.conversation``; a conversation that ends
with an assistant turn is continued from that turn's text (a prefill), so the answer holds only
what follows it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from flask import request

from trickle.config.settings import Settings
from trickle.params import GenerationParams
from web.anthropic.conversation import conversation_turns, message_tools
from web.anthropic.models import VERSION_PATTERN, CountTokensRequest, MessagesRequest
from web.common.chat_template import ChatTurn
from web.common.errors import invalid
from web.common.structured import constrained
from web.common.tools.definitions import ToolUse
from web.common.validation import sampling_defaults, served_model, validate
from web.openai.requests import chat_prompt

ROLES = ("user", "assistant")
VERSION_HEADER = "anthropic-version"
# The block types each place may hold.
BLOCKS = {
    "system": ("text",),
    "user": ("text", "tool_result"),
    "assistant": ("text", "tool_use"),
    "tool_result": ("text",),
}


@dataclass(frozen=True)
class MessagesCall:
    """A validated message request: the prompt the model reads and how to sample it."""

    model: str
    prompt: str
    params: GenerationParams
    stream: bool
    tools: ToolUse | None = None  # with tools: the answer is read for tool calls


def check_version() -> None:
    """``anthropic-version`` is optional; one that is not a date is refused."""
    version = request.headers.get(VERSION_HEADER)
    if version is not None and not re.fullmatch(VERSION_PATTERN, version):
        raise invalid(VERSION_HEADER, f"{VERSION_HEADER}: {version!r} is not a date (2023-06-01)")


def parse_messages(body: Any, settings: Settings, model: type[MessagesRequest]) -> MessagesCall:
    refuse_unsupported(body)
    req = validate(model, body)
    name = served_model(req.model, settings)
    # max_tokens is required here; the other fields left out get the model's own defaults.
    defaults = sampling_defaults(settings, name)
    params = GenerationParams(
        max_tokens=req.max_tokens,
        **defaults.under(req.temperature, req.top_p, req.top_k, None),  # no penalty field here
        stop=tuple(req.stop_sequences or ()),
    )
    tools = _tools(req, settings, name)
    params = constrained(params, tools.grammar if tools is not None else None)
    prompt = prompt_of(req, settings, name, tools)
    return MessagesCall(name, prompt, params, bool(req.stream), tools)


def parse_count(body: Any, settings: Settings, model: type[CountTokensRequest]) -> tuple[str, str]:
    """The served model and the prompt a message with this body would have."""
    refuse_unsupported(body)
    req = validate(model, body)
    name = served_model(req.model, settings)
    return name, prompt_of(req, settings, name, _tools(req, settings, name))


def _tools(req: CountTokensRequest, settings: Settings, model: str) -> ToolUse | None:
    return message_tools(req.tools, req.tool_choice, settings.model(model).tool_call_parser)


def prompt_of(
    req: CountTokensRequest, settings: Settings, model: str, tools: ToolUse | None
) -> str:
    """The conversation (and tools) through the model's chat template; a final assistant
    turn is continued, not closed."""
    declared = {tool.name for tool in req.tools or ()}
    turns = conversation_turns(req.messages, declared)
    system = req.system if isinstance(req.system, str) else ""
    if isinstance(req.system, list):
        system = "".join(block.text for block in req.system)
    head = [ChatTurn("system", system)] if system else []
    if turns[-1].role != "assistant":
        return chat_prompt([*head, *turns], settings, model, tools=tools)
    prefill = turns.pop()
    where = f"messages[{len(req.messages) - 1}].content"
    if prefill.content and tools is not None and tools.forced:
        raise invalid(
            where,
            "a forced tool call (tool_choice 'any' or 'tool') is the whole answer: it cannot "
            "continue a final assistant turn's text",
        )
    if prefill.tool_calls:
        raise invalid(
            where,
            "a conversation that ends with an assistant turn is continued from its text: "
            "that turn cannot hold tool_use blocks (send their tool_result in a user turn)",
        )
    return chat_prompt([*head, *turns], settings, model, tools=tools) + prefill.content


def refuse_unsupported(body: Any) -> None:
    """Roles and block types the Messages API has but Trickle does not serve, by name."""
    if not isinstance(body, dict):
        return  # validate() says the body must be an object
    tools = body.get("tools")
    for index, tool in enumerate(tools if isinstance(tools, list) else ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind is not None and kind != "custom":
            param = f"tools[{index}].type"
            raise invalid(
                param,
                f"{param}: server tool {kind!r} is not served (only client tools: name, "
                "description, input_schema)",
            )
    system = body.get("system")
    if isinstance(system, list):
        _check_blocks(system, "system", BLOCKS["system"])
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
        if isinstance(content, list) and role in ROLES:
            _check_blocks(content, f"messages[{index}].content", BLOCKS[role], f"a {role} turn")


def _check_blocks(blocks: list[Any], where: str, allowed: tuple[str, ...], place: str = "") -> None:
    for index, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        param = f"{where}[{index}].type"
        if isinstance(kind, str) and kind not in allowed:
            within = f" in {place}" if place else ""
            only = ", ".join(repr(name) for name in allowed)
            raise invalid(
                param,
                f"{param}: content block type {kind!r} is not supported{within} (only {only})",
            )
        inner = block.get("content") if kind == "tool_result" else None
        if isinstance(inner, list):
            _check_blocks(inner, f"{where}[{index}].content", BLOCKS["tool_result"])
