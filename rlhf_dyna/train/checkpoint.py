"""torch.distributed.checkpoint (DCP) save / load of training engines: parameters and optimizer state.

Every rank writes only its own shards; DCP records the global shapes, so a load on another world size or
training layout (dp, tp, zero, pp) reshards on read. Keys are the model's HF names whatever the layout: parameters
under `model.<name>`, AdamW state flattened per parameter (`optim.state.<name>.exp_avg`,
`optim.param_groups.<name>.lr`: torch's `flatten_optimizer_state_dict`), so each pipeline stage saves and loads
only the names it holds and a checkpoint is layout-free. A pipeline's tied embedding has two holders
(`model.embed_tokens.weight` on the first stage, `lm_head.weight` on the last, kept equal by the engine); its
AdamW state is stored once under the embedding's name, as the dp-only engine stores it, and the last stage reads
it from there (`PipelineEngine.optimizer_aliases`). Collective: every rank of the engines' mesh calls these."""
from __future__ import annotations

from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict, get_state_dict, set_model_state_dict, set_state_dict,
)

from .engine import TrainEngine, reshard

FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
SECTIONS = ("state.", "param_groups.")  # the flattened optimizer keys: <section><param name>.<slot>


def _aliases(engine: TrainEngine) -> dict[str, str]:
    """{this rank's parameter name: the name its optimizer state is stored under} (a pipeline's tied lm_head)."""
    return getattr(engine, "optimizer_aliases", lambda: {})()


def _rename(optim_sd: dict, names: dict[str, str]) -> tuple[dict, set[str]]:
    """`optim_sd` with each parameter name in `names` replaced; also the renamed keys."""
    out, renamed = {}, set()
    for key, value in optim_sd.items():
        section = next(s for s in SECTIONS if key.startswith(s))
        for old, new in names.items():
            if key.startswith(section + old + "."):
                key = section + new + key[len(section + old):]
                renamed.add(key)
        out[key] = value
    return out, renamed


def engine_state(engine: TrainEngine) -> tuple[dict[str, dict], set[str]]:
    """({"model": ..., "optim": ...} as DTensor shards, optimizer keys under their stored names; optim absent for a
    frozen engine), and the optimizer keys this rank holds under another holder's name."""
    reshard(engine.model)  # DCP reads the sharded parameters, not a leftover unsharded root
    if engine.optimizer is None:
        return {"model": get_model_state_dict(engine.model)}, set()
    model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer, options=FLAT)
    optim_sd, aliased = _rename(optim_sd, _aliases(engine))
    return {"model": model_sd, "optim": optim_sd}, aliased


def save_engines(engines: dict[str, TrainEngine], path: Path) -> None:
    """One DCP checkpoint holding every engine under its role name (actor, critic, reference)."""
    state = {}
    for role, engine in engines.items():
        state[role], aliased = engine_state(engine)
        if aliased:  # written by the parameter's own holder (equal values): one writer per key
            state[role]["optim"] = {k: v for k, v in state[role]["optim"].items() if k not in aliased}
    dcp.save(state, checkpoint_id=str(path))


def load_engines(engines: dict[str, TrainEngine], path: Path) -> None:
    """Read the named engines' shards for this rank's current layout from a DCP checkpoint, in place."""
    state = {role: engine_state(e)[0] for role, e in engines.items()}
    dcp.load(state, checkpoint_id=str(path))
    for role, engine in engines.items():
        if engine.optimizer is None:
            set_model_state_dict(engine.model, state[role]["model"])
        else:
            optim = _rename(state[role]["optim"], {v: k for k, v in _aliases(engine).items()})[0]
            set_state_dict(engine.model, engine.optimizer, model_state_dict=state[role]["model"],
                           optim_state_dict=optim, options=FLAT)
        if engine.zero < 3:
            engine.materialize_replicas()  # replicas re-read the loaded master shards
