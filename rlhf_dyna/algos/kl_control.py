"""KL coefficient controllers: fixed, or adaptive towards a target KL (Ziegler et al. 2019, sec. 2.2)."""
from __future__ import annotations

from dataclasses import dataclass

from .choices import KL_CONTROLLERS


@dataclass
class FixedKLController:
    value: float

    def update(self, current_kl: float, n_samples: int) -> None:
        """A fixed coefficient ignores the measured KL."""


@dataclass
class AdaptiveKLController:
    """coef <- coef * (1 + clip(KL / target - 1, -0.2, 0.2) * n_samples / horizon): rises while the measured KL is
    above the target, falls while below, by at most 20 % of n_samples / horizon per update."""

    value: float
    target: float
    horizon: int

    def update(self, current_kl: float, n_samples: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_samples / self.horizon




def make_kl_controller(kind: str, kl_coef: float, target: float, horizon: int) -> FixedKLController | AdaptiveKLController:
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(kl_coef, target, horizon)
    raise ValueError(f"unknown KL controller {kind!r}; valid: {KL_CONTROLLERS}")
