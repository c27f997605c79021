"""A model's engine lanes on one worker, by kind: the one vocabulary for lanes.

A lane is one batch in flight, one CTranslate2 replica. Each device runs ``ordinary`` lanes
(``inter_threads``), which every job may take, and ``spare`` lanes more: replicas sharing the
weights that run only now and then. What the spare lanes take is their ``use``: with two API
keys or more and ``tuning.reserve_lane``, ``reserve`` (one per device, only for keys below
their share of the slots while a flood fills the rest: worker/engine/fair_share.py); else
``overflow`` (``tuning.overflow_lanes_per_device``: a job no running batch takes without a long
pause, worker/engine/rebalance.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SpareUse(StrEnum):
    RESERVE = "reserve"
    OVERFLOW = "overflow"


@dataclass(frozen=True)
class Lanes:
    devices: int
    ordinary_per_device: int
    spare_per_device: int
    spare_use: SpareUse

    @property
    def ordinary(self) -> int:
        return self.devices * self.ordinary_per_device

    @property
    def spare(self) -> int:
        return self.devices * self.spare_per_device

    @property
    def per_device(self) -> int:
        """The replicas CTranslate2 builds on each device (its ``inter_threads``)."""
        return self.ordinary_per_device + self.spare_per_device

    @property
    def reserve(self) -> int:
        """The spare lanes that are the tenants' reserve: all of them, or none."""
        return self.spare if self.spare_use is SpareUse.RESERVE else 0
