"""Turn JSON requests into validated parameters; every rejection names its field.

The shapes and bounds live in ``web.common.request_models`` (the OpenAPI schemas are generated from
the same classes); this module adds what depends on state: the served models, the prompt's length in
tokens, and the defaults from configuration.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from trickle.config.sampling import SamplingDefaults
from trickle.config.settings import Settings
from trickle.jobs import context_overflow
from trickle.model_files import model_profile
from trickle.params import GenerationParams
from trickle.webhooks import WebhookRejected, check_webhook_url
from web.common.errors import invalid, not_found, unavailable
from web.common.request_errors import request_error
from web.common.request_models import JobRequest, SamplingFields

Model = TypeVar("Model", bound=BaseModel)


@dataclass(frozen=True)
class ValidatedJob:
    """A ``POST /v1/jobs`` body checked against the configuration: what a job is made of."""

    model: str
    prompt: str
    params: GenerationParams
    webhook_url: str = ""
    deadline: float | None = None


def validate(model: type[Model], body: Any) -> Model:
    """``body`` as ``model``, or the 400 that names the first bad field."""
    if not isinstance(body, dict):
        raise invalid("body", "request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise request_error(exc, model) from None


def parse_job_request(
    body: Any, settings: Settings, model: type[JobRequest] = JobRequest
) -> ValidatedJob:
    """Validate a decoded body against ``model`` and the configuration (not prompt length)."""
    request = validate(model, body)
    served = served_model(request.model, settings)
    return ValidatedJob(
        served,
        request.prompt,
        generation_params(request, settings, served),
        _webhook_url(request.webhook_url, settings),
        request.deadline,
    )


def _webhook_url(value: str | None, settings: Settings) -> str:
    if value is None:
        return ""
    try:
        return check_webhook_url(value, settings.webhooks)
    except WebhookRejected as exc:
        raise invalid("webhook_url", str(exc)) from exc


def served_model(name: str | None, settings: Settings) -> str:
    """The model a request names (or the default); 404 for one this deployment does not serve."""
    model = settings.default_model if name is None else name
    if model not in settings.models:
        raise not_found(f"model {model!r} does not exist", "model", code="model_not_found")
    return model


def generation_params(
    request: SamplingFields, settings: Settings, model: str, max_tokens: int | None = None
) -> GenerationParams:
    """The sampling fields shared by the native and OpenAI-compatible APIs; a field left out
    gets ``model``'s own default (trickle/config/sampling.py), else the API's."""
    defaults = sampling_defaults(settings, model)
    if max_tokens is None:
        max_tokens = request.max_tokens
    defaulted = max_tokens is None
    if max_tokens is None:
        max_tokens = min(
            defaults.max_tokens or settings.limits.default_max_tokens,
            settings.limits.max_tokens_ceiling,
        )
    min_tokens = request.min_tokens or 0
    if min_tokens > max_tokens:
        raise invalid("min_tokens", f"min_tokens ({min_tokens}) exceeds max_tokens ({max_tokens})")
    return GenerationParams(
        max_tokens=max_tokens,
        **defaults.under(
            request.temperature, request.top_p, request.top_k, request.repetition_penalty
        ),
        stop=tuple(request.stop or ()),
        seed=request.seed,
        ignore_eos=bool(request.ignore_eos),
        min_tokens=min_tokens,
        stop_token_ids=tuple(request.stop_token_ids or ()),
        cache_salt=request.cache_salt or "",
        max_tokens_defaulted=defaulted,
    )


def sampling_defaults(settings: Settings, model: str) -> SamplingDefaults:
    """What ``model``'s requests get for the sampling fields they leave out."""
    try:
        return model_profile(settings.model(model)).sampling
    except ValueError as exc:  # its files are broken (ConfigError too): not the client's fault
        raise unavailable(f"model {model!r} is not available: {exc}") from exc


def check_prompt_length(
    prompt_tokens: int, params: GenerationParams, settings: Settings, model: str
) -> GenerationParams:
    """Reject prompts the model cannot take, before they reach a worker; a ``max_tokens`` the
    client never sent shrinks to the context the prompt leaves (the params to run)."""
    limit = settings.limits.max_prompt_tokens
    if prompt_tokens > limit:
        raise invalid("prompt", f"prompt is {prompt_tokens} tokens; the limit is {limit}")
    context = settings.model(model).max_context_tokens
    room = context - prompt_tokens
    if params.max_tokens_defaulted and 0 < room < params.max_tokens:
        params = dataclasses.replace(params, max_tokens=max(room, params.min_tokens))
    overflow = context_overflow(prompt_tokens, params.max_tokens, context)
    if overflow:
        raise invalid("max_tokens", overflow)
    return params


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
