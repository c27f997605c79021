"""Chat messages to a prompt string, through the model's Jinja template (as Hugging Face does).

Templates run in Jinja's immutable sandbox: a template comes from configuration, but it should
still not be able to reach into the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NoReturn

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


@dataclass(frozen=True)
class ChatTurn:
    """One message of a conversation as the template reads it (the request's message, whatever
    its shape on the wire, reduced to a role and its text)."""

    role: str
    content: str


class TemplateRefused(TemplateError):
    """The template itself refused the conversation (``raise_exception``, as Hugging Face's
    templates do for, say, roles out of order): its message is the client's answer."""


def _raise_exception(message: str) -> NoReturn:
    raise TemplateRefused(message)


@lru_cache(maxsize=32)
def _compile(template: str) -> Any:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = _raise_exception
    return environment.from_string(template)


def render_chat(
    messages: list[ChatTurn],
    template: str = "",
    bos_token: str = "<s>",
    eos_token: str = "</s>",
    param: str = "messages",
) -> str:
    """The prompt text for ``messages``; the tokenizer adds the start token itself. A failing
    template is a 400 on ``param`` (the request field that holds the conversation)."""
    try:
        prompt = _compile(template or DEFAULT_CHAT_TEMPLATE).render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=True,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except TemplateRefused as exc:
        raise invalid(param, f"the model's chat template refused the messages: {exc}") from exc
    except TemplateError as exc:
        raise invalid(param, f"the model's chat template failed: {exc}") from exc
    # Templates written for Hugging Face often emit the start token as text; ours is added as an id.
    return str(prompt).removeprefix(bos_token)
