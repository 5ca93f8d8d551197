"""Automatic re-balancing (pure decision): move devices between generation and training under `split`
when the predicted gain over the remaining steps beats the predicted cost of the move.

    decision = decide_split(workload, world=8, rollout=4, staleness=1, steps_left=100, move_seconds=cost_of)
    if decision.move: ... one VPS transition of every training role onto the new set, then log decision.as_metrics()
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .simulate import Workload, split_step


@dataclass(frozen=True)
class RebalanceDecision:
    rollout_from: int
    rollout_to: int
    step_s_now: float  # predicted step time with the current sets
    step_s_new: float  # predicted step time after the move
    move_s: float  # predicted seconds of the move (VPS transitions of the training state)
    steps_left: int

    @property
    def predicted_gain_s(self) -> float:
        return (self.step_s_now - self.step_s_new) * self.steps_left - self.move_s

    @property
    def move(self) -> bool:
        return self.rollout_to != self.rollout_from

    def as_metrics(self) -> dict[str, float]:
        return {"rebalance/rollout_ranks": float(self.rollout_to), "rebalance/predicted_gain_s": self.predicted_gain_s,
                "rebalance/predicted_move_s": self.move_s, "rebalance/predicted_step_s": self.step_s_new}


def decide_split(w: Workload, world: int, rollout: int, staleness: int, steps_left: int,
                 move_seconds: Callable[[int, int], float], sizes: list[int] | None = None,
                 min_gain_fraction: float = 0.02) -> RebalanceDecision:
    """Best rollout-set size among `sizes` (default 1..world-1); stays unless the total predicted gain exceeds
    `min_gain_fraction` of the remaining time (so noise in measured phase times does not make it oscillate)."""
    now = split_step(w, world, rollout, staleness, 0.0).step_s
    stay = RebalanceDecision(rollout, rollout, now, now, 0.0, steps_left)
    best = stay
    for r in sizes or range(1, world):
        if r == rollout:
            continue
        cand = RebalanceDecision(rollout, r, now, split_step(w, world, r, staleness, 0.0).step_s,
                                 move_seconds(rollout, r), steps_left)
        if cand.predicted_gain_s > best.predicted_gain_s:
            best = cand
    if best.move and best.predicted_gain_s <= min_gain_fraction * now * steps_left:
        return stay
    return best
