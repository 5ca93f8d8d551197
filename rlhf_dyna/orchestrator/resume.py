"""Run state at a step: DCP checkpoint of the engines plus step, RNG states, data position and layout; restore.

Layout of `<run dir>/checkpoints/step_<N>/`: DCP files (`.metadata`, `__<rank>_0.distcp`), `trainer_state.pt`
(rank 0: step, loop rng, python rng, task state, KL coefficient), `rng_rank<R>.pt` (each rank's torch RNG, and its
GPU's on a CUDA rank) and `COMPLETE`."""
from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ..tracking.console import announce
from ..train.checkpoint import load_engines, save_engines
from ..train.engine import TrainEngine
from .checkpoint_dirs import CHECKPOINTS, MARKER, prune, read_marker, step_dir

TRAINER_STATE = "trainer_state.pt"


@dataclass
class RunState:
    step: int
    loop_rng: random.Random  # the loop's prompt sampler
    kl_coef: float | None = None  # the KL controller's coefficient for the next step (None: not saved)


def _rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


def rank_rng_state() -> dict:
    """This rank's torch RNG states: the CPU generator's, and the current GPU's where the rank uses CUDA (dropout and
    sampling on the GPU draw from it)."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rank_rng(state: dict) -> None:
    """Back to `rank_rng_state`'s states; a GPU state saved by a CUDA run is skipped on a rank without CUDA."""
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda"])


def _task_state(task) -> dict:
    return getattr(task, "state_dict", lambda: {})()  # tasks without a data position have nothing to save


def save_run(run_dir: Path, step: int, engines: dict[str, TrainEngine | None], loop_rng: random.Random, task,
             layout: dict, keep: int, kl_coef: float | None = None) -> Path:
    """Collective. Writes step_<N>.tmp/, then rank 0 adds the marker and renames it to step_<N>/ after a barrier,
    so a run killed mid-save leaves the previous checkpoint usable and this one ignored."""
    rank, world = dist.get_rank(), dist.get_world_size()
    checkpoints = run_dir / CHECKPOINTS
    final = step_dir(checkpoints, step)
    tmp = final.with_name(final.name + ".tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    live = {role: e for role, e in engines.items() if e is not None}
    held: list = [None] * world
    dist.all_gather_object(held, sorted(live))  # under placement=split only the train set holds engines
    save_engines(live, tmp)
    torch.save(rank_rng_state(), tmp / _rng_file(rank))
    if rank == 0:
        torch.save({"step": step, "loop_rng": loop_rng.getstate(), "python_rng": random.getstate(),
                    "task": _task_state(task), "kl_coef": kl_coef}, tmp / TRAINER_STATE)
    dist.barrier()  # every rank's files are on disk before the marker says so
    if rank == 0:
        files = [".metadata", TRAINER_STATE, *(_rng_file(r) for r in range(world))]
        marker = {"step": step, "world_size": world, "layout": layout, "engines": sorted(set().union(*held)),
                  "files": files}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        prune(checkpoints, keep)
    dist.barrier()
    return final


def restore_run(path: Path, engines: dict[str, TrainEngine | None], task) -> RunState:
    """Collective. Loads the engines (resharded to their current layout), RNG states and the task's data position."""
    marker = read_marker(path)
    live = {role: e for role, e in engines.items() if e is not None}
    absent = sorted(set(live) - set(marker["engines"]))
    if absent:
        raise RuntimeError(f"checkpoint {path} holds engines {marker['engines']}, not {absent} that this run builds; "
                           f"resume with the algorithm (and kl_coef) the run was saved with")
    load_engines(live, path)
    state = torch.load(path / TRAINER_STATE, weights_only=False)  # our own file: python rng tuples, task state
    rank = dist.get_rank()
    rng_file = path / _rng_file(rank if rank < marker["world_size"] else 0)  # another world size: rank 0's stream
    restore_rank_rng(torch.load(rng_file))
    random.setstate(state["python_rng"])
    if state["task"] and hasattr(task, "load_state_dict"):
        task.load_state_dict(state["task"])
    loop_rng = random.Random()
    loop_rng.setstate(state["loop_rng"])
    if rank == 0:
        print(f"rlhf_dyna: resumed from {path} (step {state['step']}, saved on {marker['world_size']} ranks in "
              f"layout {marker['layout']})", flush=True)
    return RunState(step=state["step"], loop_rng=loop_rng, kl_coef=state.get("kl_coef"))


def save_due(trainer, step: int) -> bool:
    """A checkpoint after `step`: every save_every steps, and at the last step when save_last."""
    every = trainer.save_every > 0 and step % trainer.save_every == 0
    return every or (trainer.save_last and step == trainer.total_steps)


POLICY_DIR = "policy"


def export_policy(trainer, actor: TrainEngine | None, model_dir: Path, run_dir: Path, writer: int = 0) -> Path:
    """Collective: the actor's full tensors one by one, written by rank `writer` into <run dir>/policy/ (HF dir).
    Ranks without the actor (split's rollout set) only wait for it."""
    from ..models.export import export_hf_dir
    from ..train.engine import full_state_dict

    if actor is not None:
        tied = bool(getattr(actor.model.config, "tie_word_embeddings", False))
        export_hf_dir(full_state_dict(actor), model_dir, run_dir / POLICY_DIR, trainer.export_max_shard_bytes,
                      tied_embeddings=tied, write=dist.get_rank() == writer)
    dist.barrier()  # nobody reads policy/ before it is renamed into place
    return run_dir / POLICY_DIR


def checkpoint_and_export(cfg, run_dir: Path, step: int, engines: dict, loop_rng: random.Random, task, layout: dict,
                          model_dir: Path, kl_coef: float | None = None, export_writer: int = 0) -> None:
    """The loop's hook after each logged step: a checkpoint when due, and the policy export with it."""
    trainer = cfg.trainer
    if not save_due(trainer, step):
        return
    t0 = time.perf_counter()
    announce(f"saving the checkpoint of step {step}...")
    path = save_run(run_dir, step, engines, loop_rng, task, layout, trainer.keep_checkpoints, kl_coef)
    t1 = time.perf_counter()
    if trainer.export_policy:
        export_policy(trainer, engines["actor"], model_dir, run_dir, writer=export_writer)
    if dist.get_rank() == 0:
        size = sum(f.stat().st_size for f in path.iterdir()) / 2**20
        exported = f", policy {run_dir / POLICY_DIR} in {time.perf_counter() - t1:.2f} s" if trainer.export_policy else ""
        print(f"rlhf_dyna: step {step}: checkpoint {path} ({size:.1f} MiB) in {t1 - t0:.2f} s{exported}", flush=True)
