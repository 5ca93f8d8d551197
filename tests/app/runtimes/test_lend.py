"""End to end: placement=lend on 4 gloo ranks (real app: Hydra, spawned ranks, vLLM rollout, FSDP2 training).

A placement never changes results, only time: with the same seed, lend (actor on ranks 0-1 and critic on 2-3 for
training, both moved there and back by VPS plans every step) and split (generation on ranks 0-1, actor and critic on
2-3) log the same losses and rewards as colocate (fp32, relative difference < 1e-5). The partial-credit task after
an SFT warm-up makes rewards, losses and the critic's targets non-trivial, so a critic trained on other rows, a move
that dropped AdamW state or a wrong shard of the batch would show. The compared runs train without ratio and value
clipping: another dp size changes values by round-off, and a token that crosses a clip boundary by round-off loses
or gains its whole gradient, so the runs would part by more than round-off from then on (with clipping, CI saw two
tokens of 73 flip in vf_clipfrac at step 2; a local run, one token at step 2, then critic/grad_norm 1.05e-5 apart at
step 3). A rank that fails during a placement change stops the run cleanly."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_dyna.elastic.faults import FAULT_ENV, FAULT_TEXT
from rlhf_dyna.launch import run_segments
from tests.app.app_runs import read_metrics, run_app
from tests.app.runtimes.placed_runs import NO_CLIP, assert_same_metrics

PPO4 = [
    "recipe=ppo_tiny", "parallel.world_size=4", "trainer.sft_warmup_steps=30", "trainer.sft_batch_size=16",
    "trainer.precision=fp32",
    "task.prompts_per_step=8", "rollout.n=4", "task.partial_credit=true", "task.eval_size=16", "task.eval_every=3",
    "trainer.total_steps=3", "trainer.save_last=false", "trainer.export_policy=false", "tracking.wandb_mode=disabled",
    *NO_CLIP,
]
MOVES = [f"reshard/{role}/{change}" for role in ("actor", "critic") for change in ("prepare_to_train_actor",
                                                                                    "train_critic_to_generate")]


def run_ok(run_dir: Path, *args: str) -> list[dict]:
    proc = run_app(*args, f"hydra.run.dir={run_dir}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return read_metrics(run_dir)


@pytest.fixture(autouse=True)
def no_leftover_ranks(tmp_path):
    """Whatever happens (a timeout kills only the launcher), no rank of this test's runs outlives it."""
    yield
    for pid in _alive_with(str(tmp_path)):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(900)
def test_lend_and_split_log_what_colocate_logs(tmp_path):
    colocate = run_ok(tmp_path / "colocate", *PPO4)
    lend = run_ok(tmp_path / "lend", *PPO4, "placement=lend")
    trained = [r for r in colocate if r["step"] > 0]
    assert any(abs(r["critic/vf_loss"]) > 1e-3 for r in trained) and any(r["reward/mean"] > 0 for r in trained)
    assert_same_metrics(colocate, lend)
    for row in lend[1:]:
        for move in MOVES:  # every step moved both roles out and back, with bytes
            assert row[f"{move}/bytes_moved"] > 0 and row[f"{move}/rounds"] >= 1, (row["step"], move)
        assert 0 < row["placement/change_share"] < 1
    first = lend[1]
    assert first["placement/build_seconds"] > 0
    # 10% of the build, or 10 ms: the whole suite once saw a 4.6 ms wait on a 19.5 ms build (scheduling on 2 cores)
    assert first["placement/wait_seconds"] <= max(0.1 * first["placement/build_seconds"], 0.01), \
        "the groups were not built ahead"
    assert not any(k.startswith("reshard/actor/") for r in colocate for k in r), "colocate moved a role"
    assert (tmp_path / "lend" / "timeline.png").stat().st_size > 0

    # PPO under split: generation on ranks 0-1, actor and critic (and the reference) train on ranks 2-3
    split = run_ok(tmp_path / "split", *PPO4, "placement=split", "placement.max_staleness=0")
    assert_same_metrics(colocate, split)
    assert all(row["timing_s/train_critic"] > 0 and "critic/vf_loss" in row for row in split[1:])


def _alive_with(text: str) -> list[int]:
    """Pids of live processes whose command line mentions `text`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                pids.append(int(proc.name)) if state != "Z" else None
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return pids


@pytest.mark.timeout(600)
def test_rank_failing_during_a_placement_change_stops_the_run_cleanly(tmp_path):
    run_dir = tmp_path / "fault"
    env = dict(os.environ, **{FAULT_ENV: "reshard/critic/prepare_to_train_actor@3"})
    cmd = [sys.executable, "-m", "rlhf_dyna", *PPO4, "trainer.sft_warmup_steps=0", "placement=lend",
           f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0
    assert f"{FAULT_TEXT} at reshard/critic/prepare_to_train_actor on rank 3" in proc.stderr, proc.stderr[-3000:]
    assert "rank 3 of 4 failed" in proc.stderr
    assert _alive_with(str(run_dir)) == [], "ranks outlived the failed run"
    ident = re.search(r"\(run (rlhfdyna-[0-9a-f]+),", proc.stderr).group(1)
    assert run_segments(ident) == [], "stale /dev/shm segments of the failed run"
    assert not (run_dir / "metrics.jsonl").exists() or all(
        r["step"] == 0 for r in read_metrics(run_dir)), "a step was logged although its placement change failed"
