"""A joining rank's process (placement=colocate, split or lend; docs/elastic/join.md): started by the launcher beside the world
(`elastic.events=[...,join@S]`), it prepares without the world, waits on the job's store for its boundary, enters
the new world there (orchestrator/join.py) and runs the remaining steps as any rank does.

    python -m rlhf_dyna.worker RUN_DIR     with RLHF_DYNA_JOINER=k (launch/spawn.py sets it for joiner process k)
    python -m rlhf_dyna elastic.join=RUN_DIR      a second terminal: this process asks the running job to admit it

A process that asks (`elastic.join`) runs with the job's resolved config, registers on the job's store once prepared,
and rank 0 admits it at the next step boundary (after the scripted changes and the SIGTERM leaves of that boundary).

Preparation (`elastic/join/prepare_seconds`): the tokenizer and task, the model skeletons on meta of the roles it will
hold, and a private world of one (a default group over its own prefix of the job's store); under colocate its vLLM
engine inside that world (opened with dummy weights from the model's config: the first weight sync in the new world
writes every weight). Under split a joiner enters the training set, so it starts no engine and writes no config.
"""
from __future__ import annotations

import atexit
import os
import time
from pathlib import Path

import torch

from ..config import Config
from ..elastic.events import Event, joiner_slots
from ..elastic.faults import kill_point
from ..elastic.join_world import (Admission, NotAdmitted, announce_pid, announce_ready, enter_private_world,
                                  job_client_store, joiner_name, mark_exited, request_name, wait_admission)
from ..elastic.placement import REWARD_MODEL
from ..elastic.sigterm import LeaveOnSigterm
from ..elastic.world_prebuild import build_of_payload
from ..launch import DistInfo
from ..launch.devices import rank_device, world_backend
from ..launch.rank import use_device
from ..launch.shm import clean_shm_segments, pin_vllm_shm_ident
from ..models.build import ModelSpec, make_hf_config
from ..models.meta_init import checkpoint_config, meta_critic, meta_policy
from ..models.reward import meta_reward_model
from .build import DTYPES
from .join import enter_as_joiner
from .live_world import Membership
from .loop import run_steps
from .next_world import prepare_next_world
from .placements import scores_with_reward_model
from .run import Run, make_run
from .runtimes import RUNTIMES, Runtime, runtime_name
from .world_changes import changes_before_step


def run_joiner(cfg: Config, out_dir: Path, index: int | None) -> None:
    """Joiner process `index` of the run's elastic.events, or (None) a process that asks to join the running job
    (elastic.join=RUN_DIR): prepare, wait for the boundary, enter, train to the end. NotAdmitted: the job refused it
    or ended first."""
    started, store = time.perf_counter(), job_client_store()
    membership = Membership.of(cfg, store, sigterm=False)  # pure until the boundary: the placement, the events
    scripted = joiner_slots(membership.events)
    name = joiner_name(index) if index is not None else request_name(store)
    process = cfg.parallel.world_size + (index if index is not None else len(scripted) + int(name.removeprefix("request")))
    announce_pid(store, name, os.getpid())  # the launcher watches it: its death before admission drops it
    membership.process = process if index is not None else name  # as the launcher names it (launch/world_record.py)
    event = scripted[index][0] if index is not None else None
    run = make_run(cfg, out_dir, joiner_dist_info(cfg, process, name, store, index is not None))
    runtime = RUNTIMES[runtime_name(cfg.placement)](run)  # colocate, split (rebalance too) or lend: checks/elastic.py
    runtime.prepare_to_join(membership, model_dir(run, name) if runtime.joiner_generates else None, process)
    models = skeletons(cfg, run)
    built = time.perf_counter() - started
    kill_point("join/prepare", process, run.dist_info.run_ident)  # tests: a joiner dead before it is ready
    announce_ready(store, name, built)
    print(f"rlhf_dyna: {name} (pid {os.getpid()}) prepared in {built:.2f} s; waiting for "
          f"{event.text if event is not None else 'the next step boundary'}", flush=True)
    def build(plan: dict) -> None:  # the world it enters, posted a step ahead: its groups built while it waits
        membership.build = build_of_payload(plan)

    kill_point("join/wait", process, run.dist_info.run_ident)  # tests: a joiner dead while it waits for admission
    try:
        admission = wait_admission(store, name, build)
    except NotAdmitted:
        runtime.close(failed=False)  # vLLM's own shutdown in the private world, before that world goes at exit
        mark_exited(store, name)
        raise
    run.start_step = admission.step
    print(f"rlhf_dyna: {name} joins after step {admission.step} as rank {admission.rank} of {admission.world_size}",
          flush=True)
    run_steps(run, runtime, lambda: enter(runtime, membership, admission, models, event))
    mark_exited(store, name)  # trained to the end, or left the world: its end is no loss


def enter(runtime: Runtime, membership: Membership, admission: Admission, models: dict,
          event: Event | None) -> None:
    """The joiner's set-up: its entry at its event, then the rest of that boundary as the old ranks run it (after a
    request, which comes last, only the next boundary's preparation)."""
    enter_as_joiner(runtime, membership, admission, models)
    if runtime.cfg.elastic.leave_on_sigterm:
        membership.sigterm = LeaveOnSigterm().install()
    step = admission.step + 1
    if event is not None:
        position = next(i for i, e in enumerate(membership.due_before(step)) if e is event)
        changes_before_step(runtime, membership, step, first=position + 1)
    else:
        prepare_next_world(runtime, membership, step)
    membership.entered_before = step
    runtime.begin()


def joiner_dist_info(cfg: Config, process: int, name: str, store, launched: bool) -> DistInfo:
    """A private world of one over the joiner's prefix of the job's store; `process`: its launch index (world_size
    + k), which names its log and trace row until the new world gives it a rank. `launched`: started by the job's
    launcher, it removes the run's /dev/shm segments at exit as the ranks do (a process that asked to join leaves them
    to the job, which may go on without it)."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    os.environ.setdefault("LOCAL_RANK", str(process))  # vLLM's external launcher reads it (elastic.join sets none)
    chosen = rank_device(cfg.parallel.device, process, local_world, torch.cuda.device_count())
    device, backend, ident = use_device(chosen, cfg.trainer.tf32), world_backend(chosen.type), os.environ["VLLM_DIST_IDENT"]
    enter_private_world(store, name, backend)
    pin_vllm_shm_ident(ident)
    if launched:
        atexit.register(clean_shm_segments, ident)
    return DistInfo(process, 1, process, local_world, 0, backend, device, ident)


def skeletons(cfg: Config, run: Run) -> dict:
    """The roles' models on the meta device (no memory), as the old world built them: the policy (actor, reference)
    and PPO's value model, from the checkpoint's config or the random-init spec's (the reward model's where the critic
    starts from it), and the reward model from its own."""
    config = make_hf_config(run.source) if isinstance(run.source, ModelSpec) else checkpoint_config(run.source)
    out = {"actor": meta_policy(config, DTYPES["fp32"])}
    if cfg.algorithm.kl_coef > 0:
        out["reference"] = meta_policy(config, DTYPES["fp32"])
    if cfg.algorithm.name == "ppo":
        critic_init = cfg.algorithm.critic_init == "reward_model"
        out["critic"] = meta_critic(checkpoint_config(cfg.reward_model.path) if critic_init else config, DTYPES["fp32"])
    if scores_with_reward_model(cfg):
        out[REWARD_MODEL] = meta_reward_model(checkpoint_config(cfg.reward_model.path), DTYPES["fp32"])
    return out


def model_dir(run: Run, name: str) -> Path:
    """What vLLM opens: a checkpoint as is, or the random-init spec's config alone (the engine loads dummy weights)."""
    if not isinstance(run.source, ModelSpec):
        return Path(run.source)
    out = run.out_dir / "model_init" / name
    make_hf_config(run.source).save_pretrained(out)
    return out
