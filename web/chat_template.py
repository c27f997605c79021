"""Chat messages to a prompt string, through the model's Jinja template (as Hugging Face does).

Templates run in Jinja's immutable sandbox: a template comes from configuration, but it should
still not be able to reach into the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from web.errors import invalid

# Works with any model, the demo bigram included: "System: ...\nUser: ...\nAssistant:".
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message.role | capitalize }}: {{ message.content }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
ROLES = frozenset({"system", "developer", "user", "assistant"})


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


def parse_messages(raw: Any) -> list[ChatMessage]:
    """Validate ``messages``: roles we can template, content as a string or text parts."""
    if not isinstance(raw, list) or not raw:
        raise invalid("messages", "messages must be a non-empty list")
    messages = []
    for position, item in enumerate(raw):
        where = f"messages[{position}]"
        if not isinstance(item, dict):
            raise invalid(where, f"{where} must be an object")
        role = item.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise invalid(f"{where}.role", f"{where}.role must be one of {sorted(ROLES)}")
        messages.append(
            ChatMessage("system" if role == "developer" else role, _content(item, where))
        )
    return messages


def _content(item: dict[str, Any], where: str) -> str:
    content = item.get("content")
    if content is None and item.get("role") == "assistant":
        return ""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise invalid(f"{where}.content[{index}]", "only text content parts are supported")
            if not isinstance(part.get("text"), str):
                raise invalid(f"{where}.content[{index}].text", "text must be a string")
            parts.append(part["text"])
        text = "".join(parts)
    else:
        raise invalid(f"{where}.content", "content must be a string or a list of text parts")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid(f"{where}.content", "content contains an unpaired surrogate") from exc
    return text


@lru_cache(maxsize=32)
def _compile(template: str) -> Any:
    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(template)


def render_chat(messages: list[ChatMessage], template: str = "", bos_token: str = "<s>") -> str:
    """The prompt text for ``messages``; the tokenizer adds the start token itself."""
    try:
        prompt = _compile(template or DEFAULT_CHAT_TEMPLATE).render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=True,
            bos_token=bos_token,
            eos_token="</s>",
        )
    except TemplateError as exc:
        raise invalid("messages", f"the model's chat template failed: {exc}") from exc
    # Templates written for Hugging Face often emit the start token as text; ours is added as an id.
    return str(prompt).removeprefix(bos_token)
