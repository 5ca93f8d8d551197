"""What the runtime tests share: runs of the app on 4 ranks whose every process carries a mark (so none may outlive
the run), the settings that keep a placement's runs comparable with colocate's, and that comparison."""
from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from pathlib import Path

from rlhf_dyna.launch.output import STACKS_SIGNAL, log_dir
from tests.app.app_runs import COMPARED, read_metrics, run_app
from tests.app.marked_processes import marked_processes

# no ratio, dual or value clip: each is a discontinuity in the gradient that round-off may cross (test_lend.py)
NO_CLIP = ["algorithm.clip_eps_low=1.0", "algorithm.clip_eps_high=1e9", "algorithm.clip_ratio_c=0",
           "algorithm.vf_clip=1e9"]
# 12 prompts and 12 eval examples divide over 1, 2, 3 and 4 rollout ranks; 48 rows over dp 1, 2, 3 and 4, each rank's
# mini-batch one micro-batch (gradient accumulation has its own tests in tests/ranks/engines)
GRPO4 = [
    "recipe=grpo_tiny", "parallel.world_size=4", "trainer.sft_warmup_steps=30", "trainer.sft_batch_size=16",
    "trainer.precision=fp32",
    "task.prompts_per_step=12", "rollout.n=4", "task.partial_credit=true", "task.eval_size=12", "task.eval_every=2",
    "trainer.total_steps=3", "algorithm.mini_batches=2", "algorithm.epochs=2", "algorithm.micro_batch_size=16",
    "algorithm.kl_coef=0.02",
    "trainer.save_last=false", "trainer.export_policy=false", "tracking.wandb_mode=disabled", *NO_CLIP,
]
SYNC = "reshard/actor/train_actor_to_generate"  # the actor's weights from the train set to the rollout set
# means of O(1) terms that cancel to ~0: PPO's pg_loss near ratio 1 is minus the mean of whitened advantages
CANCELLING = {"actor/pg_loss": 1e-5}  # rtol times the terms' scale (seen: -1.56e-6 colocate, 1.1e-7 lend)


def assert_same_metrics(expected: list[dict], got: list[dict], rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Relative 1e-5; atol only for values that are 0 but for round-off, wider for the CANCELLING ones."""
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    for want, row in zip(expected, got):
        keys = sorted(k for k in want if k.startswith(COMPARED))
        assert keys == sorted(k for k in row if k.startswith(COMPARED)), row["step"]
        for key in keys:
            tol = CANCELLING.get(key, atol)
            assert math.isclose(row[key], want[key], rel_tol=rtol, abs_tol=tol), (row["step"], key, want[key], row[key])


def weight_files() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if "-weights-" in p.name}


def run(run_dir: Path, *args: str) -> list[dict]:
    """The app in run_dir, every process of it marked with run_dir (its working directory); its metrics rows."""
    run_dir.mkdir(parents=True, exist_ok=True)
    proc = run_app(*args, f"hydra.run.dir={run_dir}", timeout=600, cwd=run_dir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return read_metrics(run_dir)


def kill_marked(run_dir: Path) -> None:
    """SIGKILL what is left of the run (a timeout kills only the launcher), after asking each process for its Python
    stacks (launch/output.stacks_on_signal), printed here: pytest shows them with the failure."""
    pids = marked_processes(str(run_dir))
    if not pids:
        return
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, STACKS_SIGNAL)
    time.sleep(1.0)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for path in sorted(log_dir(run_dir).glob("*.stacks")):
        print(f"--- {path} (the last 6000 characters)\n{path.read_text(errors='replace')[-6000:]}")
