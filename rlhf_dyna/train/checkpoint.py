"""torch.distributed.checkpoint (DCP) save / load of training engines: parameters and optimizer state.

Every rank writes only its own shards; DCP records the global shapes, so a load on another world size or
training layout (dp, tp, zero) reshards on read. Collective: every rank of the engines' mesh calls these."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import Tensor
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict, get_state_dict, set_model_state_dict, set_state_dict,
)

from .engine import TrainEngine, reshard


def engine_state(engine: TrainEngine) -> dict[str, dict]:
    """{"model": ..., "optim": ...} as DTensor shards (optim absent for a frozen engine)."""
    reshard(engine.model)  # DCP reads the sharded parameters, not a leftover unsharded root
    if engine.optimizer is None:
        return {"model": get_model_state_dict(engine.model)}
    model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer)
    return {"model": model_sd, "optim": optim_sd}


def save_engines(engines: dict[str, TrainEngine], path: Path) -> None:
    """One DCP checkpoint holding every engine under its role name (actor, critic, reference)."""
    dcp.save({role: engine_state(e) for role, e in engines.items()}, checkpoint_id=str(path))


def load_engines(engines: dict[str, TrainEngine], path: Path) -> None:
    """Read the named engines' shards for this rank's current layout from a DCP checkpoint, in place."""
    state = {role: engine_state(e) for role, e in engines.items()}
    dcp.load(state, checkpoint_id=str(path))
    for role, engine in engines.items():
        if engine.optimizer is None:
            set_model_state_dict(engine.model, state[role]["model"])
        else:
            set_state_dict(engine.model, engine.optimizer, model_state_dict=state[role]["model"],
                           optim_state_dict=state[role]["optim"])
        if engine.zero < 3:
            engine.materialize_replicas()  # replicas re-read the loaded master shards


def full_optimizer_state(engine: TrainEngine) -> dict[str, Tensor]:
    """Flat {"<param>.<exp_avg|exp_avg_sq|step>": full tensor}: the optimizer state gathered over the mesh (tests)."""
    _, optim_sd = get_state_dict(engine.model, engine.optimizer,
                                 options=StateDictOptions(full_state_dict=True, cpu_offload=False))
    return {f"{name}.{key}": value.detach().clone() if isinstance(value, Tensor) else torch.tensor(value)
            for name, slots in optim_sd["state"].items() for key, value in slots.items()}
