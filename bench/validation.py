"""Microseconds to validate one request body, JSON parsing included (issue 14's figure).

    python -m bench.validation

Runs the web tier's own parsers (``parse_job_request``, ``parse_completion_request``,
``parse_chat_request``) in-process on typical bodies; prints the best of several rounds.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from typing import Any

from trickle.config.settings import settings_from_dict

JOB = {"prompt": "The socket module", "max_tokens": 64, "temperature": 0.7, "stop": ["\n\n"]}
COMPLETION = {"model": "demo", "prompt": "The socket module", "max_tokens": 64, "stream": True}
CHAT = {
    "model": "demo",
    "messages": [{"role": "user", "content": "Hello there"}],
    "max_tokens": 64,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def per_call_us(call: Callable[[], Any], rounds: int = 7, number: int = 3000) -> float:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(number):
            call()
        samples.append((time.perf_counter() - started) / number * 1e6)
    return min(samples)  # the least disturbed round: other processes only ever add time


def main() -> None:
    from web.common import validation
    from web.openai import requests as openai_requests

    with tempfile.TemporaryDirectory() as model_dir:
        settings = settings_from_dict({"models": {"demo": {"path": model_dir}}})
        bound: dict[str, Any] = {"job": (), "completion": (), "chat": ()}
        if hasattr(validation, "validate"):  # pydantic models (issue 14), bound to the config
            from web.common.request_models import RequestModels

            models = RequestModels.bound_to(settings)
            bound = {
                "job": (models.job,),
                "completion": (models.completion,),
                "chat": (models.chat,),
            }
        raw = {
            name: json.dumps(body)
            for name, body in (("job", JOB), ("completion", COMPLETION), ("chat", CHAT))
        }
        cases = {
            "job": lambda: validation.parse_job_request(
                json.loads(raw["job"]), settings, *bound["job"]
            ),
            "completion": lambda: openai_requests.parse_completion_request(
                json.loads(raw["completion"]), settings, *bound["completion"]
            ),
            "chat": lambda: openai_requests.parse_chat_request(
                json.loads(raw["chat"]), settings, *bound["chat"]
            ),
        }
        for name, call in cases.items():
            print(f"{name:<11} {per_call_us(call):6.1f} us per request")


if __name__ == "__main__":
    main()
