"""What a model directory asks of the engine, beside CTranslate2's own files.

CTranslate2's ``compute_type="auto"`` picks the fastest type the device supports (int8 on most
CPUs). That suits real checkpoints, but not every model survives quantization: the demo model
is a bigram table compiled into one layer through one-hot activations, and int8 activation
quantization rounds away the terms that keep it exact, so it emits control bytes and unknown
pieces. A model like that says so in ``trickle.json`` (``{"compute_type": "float32"}``), and
``auto`` defers to it. An explicit compute type in the configuration always wins.
"""

from __future__ import annotations

import json
from pathlib import Path

HINTS_FILE = "trickle.json"


def write_hints(model_dir: Path, compute_type: str, why: str) -> None:
    (Path(model_dir) / HINTS_FILE).write_text(
        json.dumps({"compute_type": compute_type, "why": why}, indent=2) + "\n"
    )


def resolve_compute_type(model_dir: str | Path, configured: str) -> str:
    """The compute type to load ``model_dir`` with: the configured one unless it is ``auto``."""
    if configured != "auto":
        return configured
    path = Path(model_dir) / HINTS_FILE
    if not path.is_file():
        return configured
    try:
        hinted = json.loads(path.read_text()).get("compute_type")
    except (OSError, ValueError):
        return configured
    return str(hinted) if hinted else configured
