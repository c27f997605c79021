"""Trickle renders a model's chat template exactly as Hugging Face renders it.

transformers is not installed here, so the reference is Jinja built the way transformers'
``apply_chat_template`` builds it (``transformers/utils/chat_template_utils.py``,
``_compile_jinja_template``): an ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension (and its ``AssistantTracker`` for
``{% generation %}``, which renders its body), a ``tojson`` filter that is ``json.dumps`` with
``ensure_ascii=False``, and the ``raise_exception`` and ``strftime_now`` globals; rendered with
``messages``, ``tools``, ``add_generation_prompt`` and the special tokens. Written apart from
``web.common.chat_template``, sharing no code with it.

SmolLM2's template (pinned below, as the GGUF carries it; tests/system/test_smollm2.py checks
the built model still has it) reads no ``tools``; a Hermes-style template that does, with
``{% break %}``, ``{% generation %}`` and ``strftime_now``, checks the rest of the environment.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import pytest
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from web.common.chat_template import (
    NAMED_TOOL_TEMPLATES,
    ChatTurn,
    TurnCall,
    reads_tools,
    render_chat,
)
from web.common.errors import HttpError

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
BOS, EOS = "<|im_start|>", "<|im_end|>"

# Hermes-style tools (as Qwen 2.5's), loop controls, a generation block and the date.
TOOLS_TEMPLATE = """{{ bos_token }}
{%- if tools %}
<|im_start|>system
Today is {{ strftime_now("%Y") }}. Tools:
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
<|im_end|>
{% endif %}
{% for message in messages %}
{% if message.role == 'system' and not loop.first %}{{ raise_exception('system first') }}{% endif %}
<|im_start|>{{ message.role }}
{% if message.role == 'assistant' %}{% generation %}{{ message.content }}
{% for call in message.tool_calls or [] %}
<tool_call>{"name": {{ call.function.name | tojson }}, "arguments": {{ call.function.arguments | tojson }}}</tool_call>
{% if loop.index >= 2 %}{% break %}{% endif %}
{% endfor %}{% endgeneration %}
{% else %}{{ message.content }}
{% endif %}
<|im_end|>
{% endfor %}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""  # noqa: E501

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "Le temps qu'il fait à <city> 🌦",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


class AssistantTracker(Extension):
    """transformers' ``{% generation %}`` tag, without the mask it records in training."""

    tags = {"generation"}  # noqa: RUF012 (the type Jinja declares for it)

    def parse(self, parser: Any) -> Any:
        next(parser.stream)
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body)

    def _generation_support(self, caller: Any) -> str:
        return str(caller())


def huggingface_render(
    template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> str:
    def raise_exception(message: str) -> NoReturn:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template).render(
        messages=messages, tools=tools, add_generation_prompt=True, bos_token=BOS, eos_token=EOS
    )


CONVERSATIONS = {
    "one user turn": [ChatTurn("user", "What is the capital of France?")],
    "a system prompt": [
        ChatTurn("system", "Answer in French."),
        ChatTurn("user", "Hello"),
    ],
    "several turns": [
        ChatTurn("system", "Be brief."),
        ChatTurn("user", "Hi 😀"),
        ChatTurn("assistant", "Bonjour, café?"),
        ChatTurn("user", "中文 and <code>\n  indented</code>"),
    ],
}


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_smollm2_template_renders_as_transformers_does(name: str) -> None:
    turns = CONVERSATIONS[name]
    ours = render_chat(turns, SMOLLM2_TEMPLATE, BOS, EOS, drop_bos=False)
    assert ours == huggingface_render(SMOLLM2_TEMPLATE, [t.as_message() for t in turns])
    assert ours.endswith("<|im_start|>assistant\n")
    assert ("You are a helpful AI assistant named SmolLM" in ours) == (turns[0].role != "system")


def test_smollm2_template_reads_no_tools() -> None:
    assert not reads_tools(SMOLLM2_TEMPLATE)


def test_a_tool_template_renders_as_transformers_does() -> None:
    turns = [
        ChatTurn("user", "Météo à Paris?"),
        ChatTurn(
            "assistant",
            "",
            tool_calls=(
                TurnCall("call_1", "weather", '{"city": "Paris"}'),
                TurnCall("call_2", "weather", '{"city": "Lyon"}'),
                TurnCall("call_3", "weather", '{"city": "Nice"}'),  # after the break
            ),
        ),
        ChatTurn("tool", "12°C", tool_call_id="call_1"),
    ]
    assert reads_tools(TOOLS_TEMPLATE)
    ours = render_chat(turns, TOOLS_TEMPLATE, BOS, EOS, tools=TOOLS, drop_bos=False)
    assert ours == huggingface_render(TOOLS_TEMPLATE, [t.as_message() for t in turns], TOOLS)
    assert "à <city> 🌦" in ours and "Lyon" in ours and "Nice" not in ours
    assert f"Today is {datetime.now():%Y}" in ours


def test_a_template_refusal_is_the_clients_400() -> None:
    turns = [ChatTurn("user", "Hi"), ChatTurn("system", "late")]
    with pytest.raises(HttpError, match="system first") as refused:
        render_chat(turns, TOOLS_TEMPLATE, BOS, EOS, drop_bos=False)
    with pytest.raises(jinja2.exceptions.TemplateError, match="system first"):
        huggingface_render(TOOLS_TEMPLATE, [t.as_message() for t in turns])
    assert refused.value.status == 400 and refused.value.param == "messages"


def test_the_chatml_tool_template_writes_qwens_layout() -> None:
    """SmolLM2's fallback for requests with tools: the tools, a call and its result as Qwen
    2.5's template writes them, which the hermes parser reads back."""
    turns = [
        ChatTurn("system", "Be brief."),
        ChatTurn("user", "Paris?"),
        ChatTurn("assistant", "", tool_calls=(TurnCall("c1", "weather", '{"city": "Paris"}'),)),
        ChatTurn("tool", "sunny", tool_call_id="c1"),
    ]
    tools = [{"type": "function", "function": {"name": "weather"}}]
    rendered = render_chat(
        turns, NAMED_TOOL_TEMPLATES["chatml"], BOS, EOS, tools=tools, drop_bos=False
    )
    assert rendered.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\n")
    assert '<tools>\n{"type": "function", "function": {"name": "weather"}}\n</tools>' in rendered
    assert rendered.endswith(
        "<|im_start|>user\nParis?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
        '{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    plain = render_chat(
        [ChatTurn("user", "Hi")], NAMED_TOOL_TEMPLATES["chatml"], BOS, EOS, drop_bos=False
    )
    assert plain == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
