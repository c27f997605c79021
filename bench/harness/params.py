"""The parameters one run shares between the direct engine and every Trickle job."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from trickle.config.sections import ModelSettings, available_cores

# Trickle's defaults for the engine knobs (config_sections.ModelSettings), used on both sides.
_DEFAULTS = ModelSettings(name="defaults", path="").with_threads(available_cores())


@dataclass(frozen=True)
class RunParams:
    max_tokens: int = 128
    temperature: float = 1.0
    top_k: int = 0  # 0: the whole distribution (CTranslate2 and Trickle agree)
    top_p: float = 1.0
    device: str = _DEFAULTS.device
    compute_type: str = _DEFAULTS.compute_type
    inter_threads: int = _DEFAULTS.inter_threads
    intra_threads: int = _DEFAULTS.intra_threads
    # The batched Trickle variant; the naive one uses max_batch_size = 1.
    max_batch_size: int = 32
    max_batch_wait_ms: float = _DEFAULTS.tuning.max_batch_wait_ms

    def job_body(self, model: str, prompt: str, max_tokens: int | None = None) -> dict[str, Any]:
        """A Trickle job with exactly the engine's sampling and a fixed output length."""
        return {
            "prompt": prompt,
            "model": model,
            "max_tokens": max_tokens or self.max_tokens,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "ignore_eos": True,
        }

    def resolved_device(self) -> str:
        """``auto`` as Trickle's worker resolves it (CUDA if CTranslate2 sees a GPU)."""
        if self.device != "auto":
            return self.device
        import ctranslate2

        return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
