"""VPS catalog of the critic (`models.build.ValueModel`): the policy's backbone tensors, no lm_head, plus the scalar
value head, which the training layout treats like a norm (replicated over TP, FSDP-sharded on dim 0)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..vps.model import CatalogTensor, ModelCatalog, Role
from .catalog import catalog_from_config

VALUE_HEAD = "value_head"  # the critic's scalar head (models.build.ValueModel's module name)


def value_catalog_from_config(cfg: Any, param_dtype: str = "bfloat16", state_dtype: str = "float32") -> ModelCatalog:
    return value_catalog(catalog_from_config(cfg, param_dtype, state_dtype))


def value_catalog(policy: ModelCatalog) -> ModelCatalog:
    """The critic of a policy: its backbone without lm_head, and the value head."""
    hidden = policy.dims.hidden
    backbone = tuple(t for t in policy.tensors if t.role != Role.LM_HEAD)
    head = (CatalogTensor(f"{VALUE_HEAD}.weight", Role.FINAL_NORM, None, (1, hidden)),
            CatalogTensor(f"{VALUE_HEAD}.bias", Role.FINAL_NORM, None, (1,)))
    # arch names the model in plan caches (vps.cache.model_key): the critic must not share the policy's plans
    return replace(policy, arch=f"{policy.arch}+value", tensors=backbone + head, _by_name={})
