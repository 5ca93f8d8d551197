"""Runs of the real app that several end-to-end tests read: each run costs most of its time in rank start-up and
vLLM's initialisation, so one run serves every test that can share its settings."""
from __future__ import annotations

from pathlib import Path
from subprocess import CompletedProcess

import pytest

from tests.app.app_runs import run_app
from tests.app.runtimes.placed_runs import GRPO4, kill_marked, run
from tests.forkserver import start_forkserver


@pytest.fixture(scope="session", autouse=True)
def app_forkserver() -> None:
    """The app runs' forkserver, started before the first test that times a run."""
    start_forkserver()

# grpo_tiny shortened, with tied embeddings and an export bound of ~60 KB per file (several safetensors files)
GRPO_TINY = ["recipe=grpo_tiny", "rollout.sync=vps", "trainer.total_steps=2", "trainer.sft_warmup_steps=30",
             "trainer.sft_batch_size=16", "task.prompts_per_step=8", "rollout.n=4", "task.eval_size=16", "task.eval_every=1",
             "model.tie_word_embeddings=true", "trainer.export_max_shard_bytes=60000"]


@pytest.fixture(scope="session")
def grpo_tiny_run(tmp_path_factory) -> tuple[Path, CompletedProcess]:
    """(run dir, the app's process): test_recipes checks what the run writes, test_policy_export its policy/."""
    run_dir = tmp_path_factory.mktemp("grpo_tiny") / "run"
    proc = run_app(*GRPO_TINY, f"hydra.run.dir={run_dir}", timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir, proc


@pytest.fixture(scope="session")
def grpo4_colocate_run(tmp_path_factory) -> tuple[Path, list[dict]]:
    """GRPO4 under colocate on 4 ranks that never change, for 8 steps, a checkpoint every 2 steps (all kept): its run
    dir and rows. The rows the split runs and the live leaves and joins compare with (a shorter run's steps are this
    run's first ones: nothing before its last step depends on trainer.total_steps, and eval_every=2 evaluates at step 4
    whether or not it is the last); the checkpoints the elastic runs resumed from start with (test_live_resume.py)."""
    run_dir = tmp_path_factory.mktemp("grpo4_colocate") / "run"
    try:
        return run_dir, run(run_dir, *[a for a in GRPO4 if not a.startswith("trainer.total_steps=")],
                            "trainer.total_steps=8", "trainer.save_every=2", "trainer.keep_checkpoints=0")
    finally:
        kill_marked(run_dir)


@pytest.fixture(scope="session")
def grpo4_colocate(grpo4_colocate_run) -> list[dict]:
    """The rows of grpo4_colocate_run."""
    return grpo4_colocate_run[1]
