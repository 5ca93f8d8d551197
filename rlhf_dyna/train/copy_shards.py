"""Copy one engine's weights into another engine of the same layout, shard by shard (no gather)."""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from .engine import reshard


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


@torch.no_grad()
def copy_local_shards_(dst: nn.Module, src: nn.Module) -> None:
    """dst's parameters := src's, each rank copying only its own local shards; both must be parallelized alike
    (same mesh and placements), which is what a reference built like its actor is."""
    reshard(src)  # ZeRO-1/2 keep gathered replicas registered; the sharded params are what both sides share
    reshard(dst)
    src_params = dict(src.named_parameters())
    for name, param in dst.named_parameters():
        source = src_params.get(name)
        if source is None:
            raise ValueError(f"the source model has no parameter {name}; a reference copies an actor of the same architecture")
        same = (isinstance(param, DTensor) == isinstance(source, DTensor)) and (
            not isinstance(param, DTensor) or (param.placements == source.placements and param.device_mesh == source.device_mesh))
        if not same or param.shape != source.shape:
            raise ValueError(f"{name}: source {type(source).__name__}{tuple(source.shape)} "
                             f"{getattr(source, 'placements', '')} and destination {type(param).__name__}{tuple(param.shape)} "
                             f"{getattr(param, 'placements', '')} differ; both engines need the same mesh and layout")
        _local(param).copy_(_local(source))
    for (name, buf), (_, source_buf) in zip(dst.named_buffers(), src.named_buffers()):
        buf.copy_(source_buf)  # rotary inv_freq: same config, same values; copied so a meta-built dst needs nothing else
