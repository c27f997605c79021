"""Turn a JSON job request into validated parameters; every rejection names its field."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from web.errors import invalid, not_found
from worker.config import Settings
from worker.jobs import GenerationParams
from worker.webhooks import WebhookRejected, check_webhook_url

SAMPLING_FIELDS = frozenset(
    {"max_tokens", "temperature", "top_k", "top_p", "stop", "seed", "ignore_eos"}
    | {"repetition_penalty"}
)
JOB_FIELDS = frozenset({"prompt", "model", "webhook_url"}) | SAMPLING_FIELDS
MAX_SEED = 2**63 - 1
# CTranslate2 refuses a penalty that rounds to 0 in float32; below 0.01 is meaningless anyway.
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 10.0
# CTranslate2 needs 0 < top_p <= 1 in float32.
MIN_TOP_P = 1e-6
MAX_TOP_K = 1000


@dataclass(frozen=True)
class JobRequest:
    model: str
    prompt: str
    params: GenerationParams
    webhook_url: str = ""


def parse_job_request(body: Any, settings: Settings) -> JobRequest:
    """Validate a decoded body against the schema and the configured limits (not prompt length)."""
    if not isinstance(body, dict):
        raise invalid("body", "request body must be a JSON object")
    unknown = sorted(set(body) - JOB_FIELDS)
    if unknown:
        raise invalid(unknown[0], f"unknown field {unknown[0]!r}")
    if "prompt" not in body:
        raise invalid("prompt", "prompt is required")
    prompt = body["prompt"]
    if not isinstance(prompt, str):
        raise invalid("prompt", "prompt must be a string")
    require_encodable(prompt, "prompt")
    model = parse_model(body, settings)
    params = parse_sampling(body, settings)
    return JobRequest(model, prompt, params, _webhook_url(body.get("webhook_url"), settings))


def _webhook_url(value: Any, settings: Settings) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise invalid("webhook_url", "webhook_url must be a string")
    try:
        return check_webhook_url(value, settings.webhooks)
    except WebhookRejected as exc:
        raise invalid("webhook_url", str(exc)) from exc


def parse_model(body: dict[str, Any], settings: Settings) -> str:
    model = body.get("model", settings.default_model)
    if not isinstance(model, str):
        raise invalid("model", "model must be a string")
    if model not in settings.models:
        raise not_found(f"model {model!r} does not exist", "model", code="model_not_found")
    return model


def parse_sampling(
    body: dict[str, Any], settings: Settings, max_tokens_field: str = "max_tokens"
) -> GenerationParams:
    """The sampling fields shared by the native and OpenAI-compatible APIs."""
    limits = settings.limits
    return GenerationParams(
        max_tokens=_integer(
            body, max_tokens_field, limits.default_max_tokens, 1, limits.max_tokens_ceiling
        ),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_k=_integer(body, "top_k", 0, 0, MAX_TOP_K),
        top_p=_number(body, "top_p", 1.0, MIN_TOP_P, 1.0),
        stop=_stop(body.get("stop"), limits.max_stop_sequences, limits.max_stop_chars),
        seed=optional_integer(body, "seed", 0, MAX_SEED),
        ignore_eos=boolean(body, "ignore_eos", False),
        repetition_penalty=_number(
            body, "repetition_penalty", 1.0, MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY
        ),
    )


def check_prompt_length(
    prompt_tokens: int, params: GenerationParams, settings: Settings, model: str
) -> None:
    """Reject prompts the model cannot take, before they reach a worker."""
    limit = settings.limits.max_prompt_tokens
    if prompt_tokens > limit:
        raise invalid("prompt", f"prompt is {prompt_tokens} tokens; the limit is {limit}")
    context = settings.model(model).max_context_tokens
    if prompt_tokens + params.max_tokens > context:
        raise invalid(
            "max_tokens",
            f"prompt ({prompt_tokens} tokens) plus max_tokens ({params.max_tokens}) exceeds "
            f"the model's context of {context} tokens",
        )


def _integer(body: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, f"{name} must be an integer")
    if not low <= value <= high:
        raise invalid(name, f"{name} must be between {low} and {high}")
    return value


def optional_integer(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    if body.get(name) is None:
        return None
    return _integer(body, name, 0, low, high)


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise invalid(name, f"{name} must be a number")
    if not low <= value <= high:
        raise invalid(name, f"{name} must be in [{low}, {high}]")
    return float(value)


def boolean(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(name, f"{name} must be true or false")
    return value


def _stop(value: Any, max_count: int, max_chars: int) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("stop", "stop must be a string or a list of strings")
    if len(stops) > max_count:
        raise invalid("stop", f"at most {max_count} stop sequences are allowed")
    for stop in stops:
        require_encodable(stop, "stop")
        if not stop:
            raise invalid("stop", "stop sequences must not be empty")
        if len(stop) > max_chars:
            raise invalid("stop", f"stop sequences must be at most {max_chars} characters")
    return tuple(stops)


def require_encodable(text: str, name: str) -> None:
    """JSON can smuggle lone surrogates (\\ud800) that are not text; refuse them here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid(
            name, f"{name} contains an unpaired surrogate at position {exc.start}"
        ) from exc


def parse_wait(header: str | None, max_wait: int) -> float:
    """Seconds from ``Prefer: wait=N`` (RFC 7240), capped at ``max_wait``; 0 when absent."""
    if not header:
        return 0.0
    for preference in header.split(","):
        name, _, value = preference.strip().partition("=")
        if name.strip().lower() == "wait":
            try:
                seconds = float(value.strip().strip('"'))
            except ValueError as exc:
                raise invalid("Prefer", "Prefer: wait=N needs a number of seconds") from exc
            if not math.isfinite(seconds) or seconds < 0:
                raise invalid("Prefer", "Prefer: wait=N needs a non-negative number")
            return min(seconds, float(max_wait))
    return 0.0


def parse_after(raw: str | None, param: str) -> int:
    """The last token index a resuming client already has (-1: none)."""
    if raw is None or raw == "":
        return -1
    try:
        after = int(raw)
    except ValueError as exc:
        raise invalid(param, f"{param} must be an integer token index") from exc
    if after < -1:
        raise invalid(param, f"{param} must be >= -1")
    return after
