"""The reward model in the dry run: its host copies at cluster scale (reward_model.offload=true parks it outside the
prepare phase; each step copies it back to score and out again), as rows of the dry run's table.

A host copy moves each rank's own shards over its own device <-> host link (cluster.host_gb_per_s), all ranks at
once: the step waits for the rank with the most bytes. The reward model's catalog is its checkpoint's config.json
when reward_model.path is readable here, else the policy's backbone with a one-label score head."""
from __future__ import annotations

from pathlib import Path

from ..config import Config
from ..elastic.placement import REWARD_MODEL, changes
from ..models.checkpoint_fields import read_checkpoint_config
from ..models.reward_catalog import reward_catalog, reward_catalog_from_config
from ..vps.layout import build_layout
from ..vps.model import ModelCatalog
from ..vps.tensor import Kind
from .placements import placement_of, scores_with_reward_model


def reward_model_catalog(cfg: Config, policy: ModelCatalog) -> ModelCatalog:
    """The reward model's catalog: its checkpoint's, or a score head on the policy's backbone (`policy`)."""
    path = cfg.reward_model.path
    if path is not None and (Path(path) / "config.json").is_file():
        return reward_catalog_from_config(read_checkpoint_config(path, "reward_model.path"), param_dtype=cfg.model.dtype)
    return reward_catalog(policy)


def host_copy_rows(cfg: Config, policy: ModelCatalog) -> list[dict]:
    """One row per host copy of the reward model in a step (none unless it is offloaded)."""
    if not scores_with_reward_model(cfg) or not cfg.reward_model.offload:
        return []
    catalog = reward_model_catalog(cfg, policy)
    rows = []
    for change in (c for c in changes(placement_of(cfg)) if c.role == REWARD_MODEL and not c.is_vps):
        spec = (change.dst if change.src.parked else change.src).spec
        held = build_layout(catalog, spec, (Kind.PARAM,)).bytes_by_rank()  # a frozen role holds parameters only
        total, most = sum(held.values()), max(held.values())
        rows.append(dict(transition=change.name, src=change.src.describe(), dst=change.dst.describe(),
                         world_size=spec.world_size, bytes_total=total, bytes_moved=total, bytes_min=total,
                         bytes_local=0, rounds=1, peak_extra_bytes=most if change.src.parked else 0,
                         predicted_s=float(f"{most / (cfg.cluster.host_gb_per_s * 1e9):.6g}"), planning_s=0.0))
    return rows
