"""Metric names (DESIGN.md §5). Build names here so every producer spells them the same."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REWARD_MEAN = "reward/mean"
ACTOR_PG_LOSS = "actor/pg_loss"
ACTOR_KL = "actor/kl"  # KL(policy || reference), not the PPO old/new KL
CRITIC_VF_LOSS = "critic/vf_loss"
RESPONSE_LENGTH_MEAN = "response_length/mean"
EVAL_ACCURACY = "eval/accuracy"
TIMING_STEP = "timing_s/step"

RESHARD_FIELDS: tuple[str, ...] = ("seconds", "bytes_moved", "rounds", "peak_extra_bytes")


def _segment(kind: str, value: str) -> str:
    if not value or "/" in value:
        raise ValueError(f"{kind} must be a non-empty name without '/', got {value!r}")
    return value


def timing(phase: str) -> str:
    """timing_s/<phase>, e.g. timing("generation") -> "timing_s/generation"."""
    return f"timing_s/{_segment('phase', phase)}"


def reshard(transition: str, field: str) -> str:
    """reshard/<transition>/<field>, field one of RESHARD_FIELDS."""
    if field not in RESHARD_FIELDS:
        raise ValueError(f"reshard field must be one of {RESHARD_FIELDS}, got {field!r}")
    return f"reshard/{_segment('transition', transition)}/{field}"


def prefixed(prefix: str, metrics: Mapping[str, Any]) -> dict[str, float]:
    """{"pg_loss": tensor(0.1)} with prefix "actor" -> {"actor/pg_loss": 0.1} (values as floats)."""
    _segment("prefix", prefix)
    return {f"{prefix}/{key}": float(value) for key, value in metrics.items()}
