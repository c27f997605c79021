"""Repeatable seeds with CTranslate2's own sampler: a fresh engine thread per seeded job.

CTranslate2 draws from one mt19937 per thread, seeded from the process-wide seed the first time
that thread samples; ``set_random_seed`` never reseeds a thread that has drawn already, so the
long-lived lanes cannot be reseeded per job. A Generator created for the job with one thread
(``inter_threads=1``) has a thread that has never drawn: set the seed before its first draw and
the job samples the same tokens every time, in one ordinary ``generate_batch`` (KV cache,
repetition penalty and ``min_length`` as CTranslate2 does them for every job).

The seed is process-wide, so ``SeedGate`` holds a lock from ``set_random_seed`` until the job's
first draw (its first token's callback, which comes after that draw), and then puts the default
back: two lanes' seeded jobs cannot swap seeds, and a lane thread that has not sampled yet does
not inherit a job's seed. Creating the Generator needs no lock (nothing draws while loading).
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

from trickle.config.sections import ModelSettings

# CTranslate2 seeds are 32-bit, and this value means "from std::random_device" (its default).
UNSEEDED = 0xFFFFFFFF

_seeding = threading.Lock()  # one engine process, one seed at a time


def engine_seed(seed: int) -> int:
    """A job's seed (up to 2^63) as CTranslate2's 32-bit one, never the 'unseeded' value."""
    return seed % UNSEEDED


class SeedGate:
    """The process's seed, held for one job from ``__enter__`` to its first draw (``drawn``)."""

    def __init__(self, ctranslate2: Any, seed: int):
        self._ct2 = ctranslate2
        self._seed = engine_seed(seed)
        self._held = False

    def __enter__(self) -> SeedGate:
        _seeding.acquire()
        self._held = True
        self._ct2.set_random_seed(self._seed)
        return self

    def drawn(self) -> None:
        """The job's thread has drawn (so seeded its generator): the next job may seed."""
        if self._held:
            self._held = False
            self._ct2.set_random_seed(UNSEEDED)
            _seeding.release()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.drawn()  # a job that failed or ended before its first token


def job_generator(ctranslate2: Any, model: ModelSettings, device: str, compute_type: str) -> Any:
    """A Generator of the served model for one seeded job: one thread, which has never drawn
    (on the first of the model's devices)."""
    return ctranslate2.Generator(
        model.path,
        device=device,
        device_index=[model.device_index[0]],
        compute_type=compute_type,
        inter_threads=1,
        intra_threads=model.intra_threads,
    )
