"""VPS catalog of a reward model (`models.reward`): the policy's backbone tensors, no lm_head, plus the bias-free score
head [num_labels, hidden], which the training layout treats like a norm (replicated over TP, FSDP-sharded on dim 0)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..vps.model import CatalogTensor, ModelCatalog, Role
from .catalog import catalog_from_config

SCORE_HEAD = "score"  # the classifier's head, as transformers names it in *ForSequenceClassification


def reward_catalog_from_config(cfg: Any, param_dtype: str = "bfloat16", state_dtype: str = "float32") -> ModelCatalog:
    return reward_catalog(catalog_from_config(cfg, param_dtype, state_dtype), getattr(cfg, "num_labels", 1))


def reward_catalog(policy: ModelCatalog, num_labels: int = 1) -> ModelCatalog:
    """A sequence classifier on a policy's backbone: the backbone without lm_head, and the score head."""
    backbone = tuple(t for t in policy.tensors if t.role != Role.LM_HEAD)
    head = CatalogTensor(f"{SCORE_HEAD}.weight", Role.FINAL_NORM, None, (num_labels, policy.dims.hidden))
    # arch names the model in plan caches (vps.cache.model_key): the reward model must not share the policy's plans
    return replace(policy, arch=f"{policy.arch}+score", tensors=backbone + (head,), _by_name={})
