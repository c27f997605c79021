"""Chat messages to a prompt string, through the model's Jinja template (as Hugging Face does).

Templates run in Jinja's immutable sandbox: a template comes from configuration, but it should
still not be able to reach into the server. They read what Hugging Face's ``apply_chat_template``
gives them: ``messages`` (an assistant's ``tool_calls`` with their arguments as a mapping, a
tool result's ``tool_call_id``), ``tools`` (function definitions, or None), ``bos_token``,
``eos_token``, ``add_generation_prompt``, in the environment transformers builds: trim_blocks
and lstrip_blocks, ``{% break %}`` and ``{% continue %}`` (loopcontrols), ``{% generation %}``
blocks (rendered as their body), its ``tojson`` filter (no HTML escaping), and the
``raise_exception`` and ``strftime_now`` globals.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, NoReturn

from jinja2 import TemplateError, meta, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from web.common.errors import invalid

# Works with any model, the demo bigram included: "System: ...\nUser: ...\nAssistant:". With
# tools, a system line lists them and asks for hermes-style calls (the default tool_call_parser);
# an assistant's calls are written back the same way, a tool's result as "Tool: ...".
DEFAULT_CHAT_TEMPLATE = (
    "{% if tools %}"
    "System: You can call these functions. To call one, write "
    '<tool_call>{"name": "<name>", "arguments": {<arguments>}}</tool_call>\n'
    "{% for tool in tools %}{{ (tool.function or tool) | tojson }}\n{% endfor %}"
    "{% endif %}"
    "{% for message in messages %}"
    "{{ message.role | capitalize }}: {{ message.content }}"
    "{% for call in message.tool_calls or [] %}"
    '<tool_call>{"name": {{ call.function.name | tojson }}, '
    '"arguments": {{ call.function.arguments | tojson }}}</tool_call>'
    "{% endfor %}{{ '\\n' }}"  # a newline right after a block tag would be trimmed
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


# ChatML with Hermes-style tools, as Qwen 2.5's template writes them: the tools in the system
# turn, an assistant's calls in <tool_call> tags, a tool's result as a user turn in
# <tool_response> tags. For ChatML models whose own template never reads tools (SmolLM2).
# Jinja's trim_blocks eats a newline right after a block tag: those are written as {{ '\n' }}.
CHATML_TOOLS_TEMPLATE = (
    "{% set system = messages[0].content if messages and messages[0].role == 'system' "
    "else 'You are a helpful assistant.' %}"
    "<|im_start|>system\n{{ system }}"
    "{% if tools %}{{ '\\n\\n' }}# Tools\n\nYou may call one or more functions to assist "
    "with the user query.\n\nYou are provided with function signatures within <tools></tools> "
    "XML tags:\n"
    "<tools>{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}"
    "</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    "{% endif %}<|im_end|>\n"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{% elif not (loop.first and message.role == 'system') %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{% for call in message.tool_calls or [] %}"
    '{{ "\n" if message.content or not loop.first }}<tool_call>\n{"name": '
    '{{ call.function.name | tojson }}, "arguments": {{ call.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# What a model's ``tool_chat_template`` may name instead of a Jinja string of its own.
NAMED_TOOL_TEMPLATES = {"builtin": DEFAULT_CHAT_TEMPLATE, "chatml": CHATML_TOOLS_TEMPLATE}


@dataclass(frozen=True)
class TurnCall:
    """A tool call an assistant made earlier in the conversation."""

    id: str
    name: str
    arguments: str  # JSON text, as OpenAI's clients send it back


@dataclass(frozen=True)
class ChatTurn:
    """One message of a conversation as the template reads it (the request's message, whatever
    its shape on the wire, reduced to a role, its text, and its tool calls or the call it
    answers)."""

    role: str
    content: str
    tool_calls: tuple[TurnCall, ...] = ()
    tool_call_id: str | None = None

    def as_message(self) -> dict[str, Any]:
        """The message as Hugging Face templates read it: keys only when they apply (templates
        test ``message.tool_calls is defined``), arguments as a mapping when they are a JSON
        object (templates write them with ``tojson``; vLLM hands them over the same way)."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": _arguments(call.arguments)},
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


def _arguments(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """Hugging Face's ``tojson``: plain JSON (Jinja's own escapes ``<`` and ``'`` for HTML)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class TemplateRefused(TemplateError):
    """The template itself refused the conversation (``raise_exception``, as Hugging Face's
    templates do for, say, roles out of order): its message is the client's answer."""


def _raise_exception(message: str) -> NoReturn:
    raise TemplateRefused(message)


def _strftime_now(format: str) -> str:
    """Hugging Face's ``strftime_now``: the local time (Llama 3's templates write the date)."""
    return datetime.now().strftime(format)


class GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}``: transformers marks the assistant's part with
    it (for training masks); rendering a prompt, it is its body."""

    tags = {"generation"}  # noqa: RUF012 (the type Jinja declares for it)

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, loopcontrols]
    )
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.filters["tojson"] = _tojson
    return environment


@lru_cache(maxsize=32)
def _compile(template: str) -> Any:
    return _environment().from_string(template)


@lru_cache(maxsize=32)
def reads_tools(template: str) -> bool:
    """Whether the template uses ``tools`` at all (one that never reads it would drop them)."""
    try:
        names = meta.find_undeclared_variables(
            _environment().parse(template or DEFAULT_CHAT_TEMPLATE)
        )
    except TemplateError:
        return False  # rendering reports the error itself
    return "tools" in names


def render_chat(
    messages: list[ChatTurn],
    template: str = "",
    bos_token: str = "<s>",
    eos_token: str = "</s>",
    param: str = "messages",
    tools: list[dict[str, Any]] | None = None,
    drop_bos: bool = True,
) -> str:
    """The prompt text for ``messages`` (and ``tools``, function definitions as Hugging Face
    takes them). ``drop_bos``: the tokenizer adds the start token itself (or cannot read it as
    text), so a leading ``bos_token`` the template writes is dropped. A failing template is a
    400 on ``param`` (the request field that holds the conversation)."""
    try:
        prompt = _compile(template or DEFAULT_CHAT_TEMPLATE).render(
            messages=[m.as_message() for m in messages],
            tools=tools or None,
            add_generation_prompt=True,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except TemplateRefused as exc:
        raise invalid(param, f"the model's chat template refused the messages: {exc}") from exc
    except TemplateError as exc:
        raise invalid(param, f"the model's chat template failed: {exc}") from exc
    # Templates written for Hugging Face often emit the start token as text; ours is added as an
    # id (a Hugging Face tokenizer that adds none reads it from the text, as transformers does).
    return str(prompt).removeprefix(bos_token) if drop_bos else str(prompt)
