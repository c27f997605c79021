"""Tool requests the web tier refuses before any job exists, each with a 400 naming the field,
and the templates tools go through (the model's own, or the fallback its configuration names)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from trickle.config.sections import ModelSettings
from trickle.config.settings import Settings
from web.common.chat_template import ChatTurn, TurnCall, render_chat
from web.common.errors import HttpError
from web.common.tools.definitions import chat_tools
from web.common.tools.models import ChatTool
from web.openai.requests import chat_prompt

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object"}},
}
FLAT: dict[str, Any] = {"type": "function", "name": "get_weather"}
UNENFORCEABLE: dict[str, Any] = {"name": "f", "parameters": {"type": "object", "not": {}}}
ASK = [{"role": "user", "content": "Weather?"}]
NO_TOOLS_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "x" * 65}}]},
            "tools[0].function.name",
        ),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        (  # strict under auto: a schema constrained decoding cannot keep
            {"tools": [{"type": "function", "function": {**UNENFORCEABLE, "strict": True}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": [WEATHER], "logprobs": True}, "logprobs"),
        ({"messages": [{"role": "tool", "content": "sunny"}]}, "messages[0].tool_call_id"),
        (
            {"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]},
            "messages[0].tool_call_id",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": "x",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    }
                ]
            },
            "messages[0].tool_calls",
        ),
    ],
)
def test_chat_tool_requests_refused_by_field(
    settings: Settings, make_app: Callable[[Settings], Flask], body: dict[str, Any], param: str
) -> None:
    client = make_app(settings).test_client()
    reply = client.post("/v1/chat/completions", json={"messages": ASK, **body})
    assert reply.status_code == 400, reply.get_json()
    assert reply.get_json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [FLAT, FLAT]}, "tools[1].name"),
        ({"tools": [{**FLAT, "name": "bad.name"}]}, "tools[0].name"),
        ({"tools": [FLAT], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{**FLAT, **UNENFORCEABLE, "strict": True}]}, "tools[0].parameters"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
        (
            {"tools": [FLAT], "include": ["message.output_text.logprobs"]},
            "include",
        ),
    ],
)
def test_responses_tool_requests_refused_by_field(
    settings: Settings, make_app: Callable[[Settings], Flask], body: dict[str, Any], param: str
) -> None:
    client = make_app(settings).test_client()
    reply = client.post("/v1/responses", json={"input": "Weather?", **body})
    assert reply.status_code == 400, reply.get_json()
    assert reply.get_json()["error"]["param"] == param


def with_model(settings: Settings, demo: Path, **keys: Any) -> Settings:
    model = ModelSettings("plain", str(demo), chat_template=NO_TOOLS_TEMPLATE, **keys)
    return dataclasses.replace(settings, models={**settings.models, "plain": model})


def test_a_template_that_cannot_render_tools_is_a_400_unless_a_fallback_is_named(
    settings: Settings, make_app: Callable[[Settings], Flask], demo_model_dir: Path
) -> None:
    plain = with_model(settings, demo_model_dir)
    client = make_app(plain).test_client()
    for route, body in (
        ("/v1/chat/completions", {"messages": ASK, "tools": [WEATHER]}),
        ("/v1/responses", {"input": "Weather?", "tools": [FLAT]}),
    ):
        reply = client.post(route, json={"model": "plain", **body})
        assert reply.status_code == 400, reply.get_json()
        error = reply.get_json()["error"]
        assert error["param"] == "tools" and "tool_chat_template" in error["message"]
    tools = chat_tools(None, None, None, "hermes")
    assert tools is None  # no tools: the model's own template, as always
    turns = [ChatTurn("user", "Weather?")]
    assert chat_prompt(turns, plain, "plain") == "Weather?"
    tool_use = chat_tools([_chat_tool()], "auto", None, plain.model("plain").tool_call_parser)
    with pytest.raises(HttpError):
        chat_prompt(turns, plain, "plain", tools=tool_use)
    for fallback in ("builtin", "{{ tools | length }} tools: {{ messages[0].content }}"):
        named = with_model(settings, demo_model_dir, tool_chat_template=fallback)
        prompt = chat_prompt(turns, named, "plain", tools=tool_use)
        assert "get_weather" in prompt or prompt == "1 tools: Weather?"


def _chat_tool() -> Any:
    from web.common.tools.models import ChatTool

    return ChatTool.model_validate(WEATHER)


def test_the_built_in_template_renders_tools_calls_and_results_as_hugging_face_passes_them() -> (
    None
):
    plain = [ChatTurn("system", "Be brief."), ChatTurn("user", "Hi")]
    # Without tools the prompt is exactly what it always was.
    assert render_chat(plain) == "System: Be brief.\nUser: Hi\nAssistant:"
    turns = [
        ChatTurn("user", "Weather in <Paris>?"),
        ChatTurn("assistant", "", (TurnCall("call_1", "get_weather", '{"city": "Paris"}'),)),
        ChatTurn("tool", "sunny", tool_call_id="call_1"),
    ]
    prompt = render_chat(turns, tools=[WEATHER])
    assert prompt.startswith("System: You can call these functions.")
    assert '{"name": "get_weather", "parameters": {"type": "object"}}\n' in prompt
    # Hugging Face's tojson: no HTML escapes; arguments handed over as a mapping.
    assert "User: Weather in <Paris>?\n" in prompt
    assert (
        'Assistant: <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
        "</tool_call>\nTool: sunny\nAssistant:"
    ) in prompt
    # A template reads the calls and the call a result answers as HF templates do.
    template = (
        "{% for m in messages %}{{ m.role }}"
        "{% if m.tool_calls is defined %}{{ m.tool_calls[0].function.arguments.city }}{% endif %}"
        "{% if m.tool_call_id is defined %}{{ m.tool_call_id }}{% endif %}|{% endfor %}"
    )
    assert render_chat(turns, template) == "user|assistantParis|toolcall_1|"


def _tool(name: str, strict: bool | None, parameters: dict[str, Any] | None = None) -> ChatTool:
    function = {"name": name, "parameters": parameters or {"type": "object"}, "strict": strict}
    return ChatTool.model_validate({"type": "function", "function": function})


def test_strict_tools_are_constrained_under_every_choice_where_a_call_can_happen() -> None:
    """auto: a lazy grammar (text, or calls held to the tools); none: no call, no grammar;
    no strict tool under auto: parsed only, as before."""
    strict, loose = _tool("get_weather", True), _tool("f", None, UNENFORCEABLE["parameters"])
    auto = chat_tools([strict, loose], "auto", None, "hermes")
    assert auto is not None and auto.grammar is not None and not auto.forced
    assert auto.parser == "hermes" and auto.choice == "auto"
    none = chat_tools([strict], "none", None, "hermes")
    assert none is not None and none.grammar is None and none.parser is None
    plain = chat_tools([_tool("get_weather", False)], None, None, "hermes")
    assert plain is not None and plain.grammar is None and plain.parser == "hermes"
    required = chat_tools([strict], "required", None, "hermes")
    assert required is not None and required.forced and required.grammar != auto.grammar
