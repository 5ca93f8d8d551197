"""End to end: placement=split with max_staleness=0 on 4 gloo ranks (real app: Hydra, spawned ranks, vLLM engines in
their own processes on ranks 0-1, FSDP2 training of the actor and its reference on ranks 2-3).

A placement never changes results, only time: with the same seed, split logs the same losses, rewards and eval
accuracy as colocate (fp32, relative difference < 1e-5). The samples agree because sampling seeds are global prompt
indices; the weights the rollout set generates with arrive by a VPS plan every step, so a stale or wrong sync would
change the rewards of the next step. No engine process outlives the run and no weight file stays in /dev/shm."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_placement_lend import assert_same_metrics
from tests.e2e.test_recipes import read_metrics

GRPO4 = [
    "recipe=grpo_tiny", "parallel.world_size=4", "trainer.sft_warmup_steps=30", "trainer.precision=fp32",
    "task.prompts_per_step=8", "rollout.n=4", "task.partial_credit=true", "task.eval_size=16", "task.eval_every=2",
    "trainer.total_steps=3", "algorithm.mini_batches=2", "algorithm.kl_coef=0.02", "trainer.save_last=false",
    "trainer.export_policy=false", "tracking.wandb_mode=disabled",
]
SYNC = "reshard/actor/train_actor_to_generate"
MARK = "RLHF_DYNA_TEST_RUN"  # inherited by every rank and engine process of the run: finds orphans by environment


def with_mark(mark: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"{MARK}={mark}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name)) if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z" else None
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return pids


def weight_files() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if "-weights-" in p.name}


def run(run_dir: Path, *args: str) -> list[dict]:
    env = dict(os.environ, **{MARK: str(run_dir)})
    cmd = [sys.executable, "-m", "rlhf_dyna", *args, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return read_metrics(run_dir)


@pytest.fixture(autouse=True)
def no_leftover_processes(tmp_path):
    yield
    for name in ("colocate", "split"):  # a timeout kills only the launcher
        for pid in with_mark(str(tmp_path / name)):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(900)
def test_split_staleness_0_logs_what_colocate_logs(tmp_path):
    colocate = run(tmp_path / "colocate", *GRPO4)
    before = weight_files()
    split = run(tmp_path / "split", *GRPO4, "placement=split", "placement.max_staleness=0")
    assert with_mark(str(tmp_path / "split")) == [], "engine or rank processes outlived the split run"
    assert weight_files() - before == set(), "the split run left its weight files in /dev/shm"
    trained = [r for r in colocate if r["step"] > 0]
    assert any(r["reward/mean"] > 0 for r in trained) and any(abs(r["actor/pg_loss"]) > 1e-3 for r in trained)
    assert "eval/accuracy" in split[-1] and "actor/kl" in split[-1]
    assert_same_metrics(colocate, split)
    for row in split[1:]:  # every step moved the actor's weights to the rollout set by a VPS plan
        assert row[f"{SYNC}/bytes_moved"] > 0 and row[f"{SYNC}/rounds"] >= 1, row["step"]
        assert 0 < row["placement/change_share"] < 1 and row["placement/staleness"] == 0
    assert not any(k.startswith(SYNC) for r in colocate for k in r), "colocate logged a split transition"


def test_split_refuses_what_it_does_not_run_before_spawn(tmp_path):
    cmd = [sys.executable, "-m", "rlhf_dyna", *GRPO4, "placement=split", "placement.max_staleness=0",
           "trainer.save_last=true", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "placement=split" in proc.stderr and "trainer.save_last=false" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.timeout(600)
def test_split_staleness_1_generates_ahead_and_logs_its_staleness(tmp_path):
    """Generation of step k+1 (weights of step k-1) overlaps the training of step k; the run logs staleness 1 from
    step 2 on (step 1's samples come from the initial weights, on-policy), and still learns from real rewards."""
    rows = run(tmp_path / "split", *GRPO4, "placement=split", "placement.max_staleness=1")
    assert with_mark(str(tmp_path / "split")) == [], "engine or rank processes outlived the split run"
    assert [r["placement/staleness"] for r in rows[1:]] == [0.0, 1.0, 1.0]
    assert all(r[f"{SYNC}/bytes_moved"] > 0 for r in rows[1:]) and "eval/accuracy" in rows[-1]
    assert any(r["reward/mean"] > 0 for r in rows[1:])
