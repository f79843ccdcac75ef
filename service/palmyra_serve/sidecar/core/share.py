"""What admission knows of a request's tenant (admission/fair_queue.py orders the queue by it; the
tenants file sets it, tenants/config.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Share:
    tenant: str = "default"
    weight: float = 1.0
    queue_share: float = 1.0  # the part of max_queue this tenant may hold, in (0, 1]

    def queue_cap(self, max_queue: int) -> int:
        return max(1, int(max_queue * self.queue_share)) if max_queue > 0 else 0


DEFAULT_SHARE = Share()
