"""The train -> rollout weight syncs by `rollout.sync` name: `vps` (each rollout rank receives exactly its shard, by
plan) and `naive` (full tensors gathered on every rank: the benchmark baseline)."""
from __future__ import annotations

from collections.abc import Callable

from .sync import NaiveSync, WeightSync
from .vps_sync import VpsSync

SYNCS: dict[str, Callable[..., WeightSync]] = {"naive": NaiveSync, "vps": VpsSync}


def make_sync(name: str, **kwargs) -> WeightSync:
    if name not in SYNCS:
        raise ValueError(f"unknown weight sync {name!r}; valid: {sorted(SYNCS)}")
    return SYNCS[name](**kwargs)
