"""The optimizer state of an engine gathered whole, to compare two engines in tests."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from rlhf_dyna.train.engine import TrainEngine


def full_optimizer_state(engine: TrainEngine) -> dict[str, Tensor]:
    """Flat {"<param>.<exp_avg|exp_avg_sq|step>": full tensor}: the optimizer state gathered over the mesh, and over
    a pipeline's stages ."""
    _, optim_sd = get_state_dict(engine.model, engine.optimizer, options=StateDictOptions(
        full_state_dict=True, cpu_offload=False, flatten_optimizer_state_dict=True))
    mine = {key[len("state."):]: value.detach().clone() if isinstance(value, Tensor) else torch.tensor(value)
            for key, value in optim_sd.items() if key.startswith("state.")}
    pp_mesh = getattr(engine, "pp_mesh", None)
    if pp_mesh is None:
        return mine
    stages: list[dict[str, Tensor] | None] = [None] * pp_mesh.size()
    dist.all_gather_object(stages, mine, group=pp_mesh.get_group())
    return {key: value for stage in stages for key, value in stage.items()}
