"""What the engine process says once its model is loaded and warm (worker/engine/process.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineReady:
    """The engine is loaded and warm: its device, and a decoding step's seconds by batch size
    (measured during warm-up; the scheduler's first restart decisions are priced with them)."""

    device: str
    step_seconds: dict[int, float]
    prefill_seconds_per_token: float = 0.0  # a restart's catch-up is priced with it

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "step_seconds": dict(self.step_seconds),
            "prefill_seconds_per_token": self.prefill_seconds_per_token,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineReady:
        steps = {int(size): float(seconds) for size, seconds in data["step_seconds"].items()}
        prefill = float(data.get("prefill_seconds_per_token", 0.0))
        return cls(str(data["device"]), steps, prefill)
