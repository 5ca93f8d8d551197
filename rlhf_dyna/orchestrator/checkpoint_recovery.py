"""A lost rank's state loaded from the newest complete checkpoint in place, without a restart: the survivors' side
where no surviving replica holds a lost piece (elastic.replicas=0 with elastic.recover_from_checkpoint, or a replica
holder lost too; orchestrator/recovery.py calls it once the survivors are in their new world; docs/elastic/recovery.md,
"From the checkpoint in place").

The survivors build empty engines on the new world's mesh and load the checkpoint into them as `trainer.resume` of
it on the surviving world would (orchestrator/resume.restore_run: DCP reshards into the new layout; the RNGs, the
task's position and the KL coefficient of the checkpoint's step), so the steps after it redo what that resume runs.
"""
from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from ..parallel_layout import ParallelLayout
from ..train.mesh import build_mesh
from ..transition.relayout import empty_engine_like, meta_skeleton
from .checkpoint_dirs import CHECKPOINTS, scan
from .run import Run


def newest_complete(run_dir: Path) -> Path | None:
    """Collective: the newest complete checkpoint under the run's dir, as rank 0 (whose saves and prunes have ended:
    it is recovering) sees it; None if there is none."""
    box = [None]
    if dist.get_rank() == 0:
        complete, _ = scan(run_dir / CHECKPOINTS)
        box = [str(complete[-1][1]) if complete else None]
    dist.broadcast_object_list(box, src=0)
    return Path(box[0]) if box[0] is not None else None


def load_in_place(run: Run, runtime, layout: ParallelLayout, placement, path: Path, reform_rollout) -> int:
    """Collective over the new world (of `placement`): every role this rank held rebuilt empty on `layout`'s mesh, the
    rollout re-formed (`reform_rollout()`), the checkpoint at `path` loaded into the engines and the run's state, the
    weights synced; the checkpoint's step (the caller rewinds the metrics to it)."""
    mesh, engines = build_mesh(layout), {}
    for role, old in runtime.engines().items():
        if old is not None:
            engines[role] = empty_engine_like(old, layout, mesh, meta_skeleton(old.model))
            setattr(runtime, role, None)  # the old world's engine: its state is rebuilt
    if runtime.scorer is not None:  # frozen, in no checkpoint: loaded from its files as at the start
        runtime.scorer.rebuild(placement)
    reform_rollout()
    runtime.enter_world(layout, engines, placement)
    state = runtime.restore(path)  # as trainer.resume: engines, this rank's RNGs, the task's position
    run.rng = state.loop_rng
    if state.kl_coef is not None:
        run.kl_ctl.value = state.kl_coef
    runtime.sync_weights()
    return state.step
