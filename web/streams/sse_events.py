"""One Server-Sent Event whose ``event:`` line names its JSON payload's ``type``.

The Responses API and Anthropic's Messages API both frame their streams this way.
"""

from __future__ import annotations

import json
from typing import Any


def typed_event(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
