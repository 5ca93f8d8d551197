"""Models built on the meta device (no memory), parallelized there, then materialised shard by shard.

Order, as torchtitan does it: build under `torch.device("meta")`, apply TP / FSDP2 (placements only), `to_empty`
(each rank allocates only its shards), then fill: weights from the checkpoint per shard, buffers recomputed.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from .build import VALUE_HEAD, ValueModel
from .load_shards import SafetensorsCheckpoint, load_shards_


def meta_policy(config: PretrainedConfig, dtype: torch.dtype) -> nn.Module:
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")


def meta_critic(config: PretrainedConfig, dtype: torch.dtype) -> ValueModel:
    with torch.device("meta"):
        return ValueModel(config, dtype)


@torch.no_grad()
def recompute_buffers_(model: nn.Module, device: torch.device) -> None:
    """Non-persistent buffers (rotary `inv_freq`) are not in checkpoints: rebuild each owning module from its config
    on the real device and copy its buffers over; `to_empty` left them as garbage."""
    for module in model.modules():
        own = dict(module.named_buffers(recurse=False))
        if not own:
            continue
        config = getattr(module, "config", None)
        if config is None:
            raise ValueError(f"{type(module).__name__} has buffers {sorted(own)} but no config to recompute them from")
        with torch.device(device):
            fresh = type(module)(config)
        for name, buf in fresh.named_buffers(recurse=False):
            own[name].copy_(buf)


def value_head_init(config: PretrainedConfig, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    """The critic's value head, seeded: it is not in a policy checkpoint. Full tensors (hidden_size + 1 values)."""
    torch.manual_seed(seed)
    head = nn.Linear(config.hidden_size, 1, dtype=dtype)
    return {f"{VALUE_HEAD}.{name}": t for name, t in head.state_dict().items()}


def checkpoint_loader(path: str | Path, device: torch.device, extra: dict[str, torch.Tensor] | None = None,
                      renamed: dict[str, str] | None = None) -> Callable[[nn.Module], SafetensorsCheckpoint]:
    """What an engine calls once its meta model is parallelized: allocate the shards, read them, fix the buffers.
    `renamed`: parameters read from a tensor of another name (a critic's value head from a reward model's score head).
    Returns the checkpoint reader (its `bytes_read` says what this rank read)."""
    renamed = renamed or {}

    def materialize(model: nn.Module) -> SafetensorsCheckpoint:
        model.to_empty(device=device)
        ckpt = SafetensorsCheckpoint.open(path)
        load_shards_(model, ckpt, extra or {}, name_in_checkpoint=lambda name: renamed.get(name, name))
        recompute_buffers_(model, device)
        return ckpt
    return materialize


def checkpoint_config(path: str | Path) -> PretrainedConfig:
    return AutoConfig.from_pretrained(Path(path))
