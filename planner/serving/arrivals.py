"""An arrival process reduced to what the serving queueing math reads: its rate and its burstiness. Ground floor of
the serving planner: queueing.py (the math, and parsing --arrival) and arrival_trace.py (traces) both build on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Arrivals:
    """An arrival process, reduced to what the queueing math reads: its rate and its burstiness."""

    rate_per_s: float
    """Mean request arrival rate (requests per second)."""
    cv2: float
    """Squared coefficient of variation of inter-arrival times (Poisson 1; gamma:CV -> CV**2; a trace: measured)."""
    source: str
    """Where it comes from: "poisson", "gamma:CV=2", "trace PATH (N requests)"."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate_per_s) and self.rate_per_s > 0):
            raise ValueError(f"arrival rate must be a positive number of requests per second, got {self.rate_per_s}")
        if not (math.isfinite(self.cv2) and self.cv2 >= 0):
            raise ValueError(f"inter-arrival cv2 must be a finite number >= 0, got {self.cv2}")


def poisson(rate_per_s: float) -> Arrivals:
    """Poisson arrivals (exponential gaps, cv² = 1) at ``rate_per_s``."""
    return Arrivals(rate_per_s=float(rate_per_s), cv2=1.0, source="poisson")


def gamma(rate_per_s: float, cv: float) -> Arrivals:
    """Renewal arrivals with gamma-distributed gaps of coefficient of variation ``cv`` (1: Poisson, 0: regular)."""
    return Arrivals(rate_per_s=float(rate_per_s), cv2=float(cv) ** 2, source=f"gamma:CV={cv:g}")
