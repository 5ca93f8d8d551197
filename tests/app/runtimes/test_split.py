"""End to end: placement=split with max_staleness=0 on 4 gloo ranks (real app: Hydra, spawned ranks, vLLM engines in
their own processes on ranks 0-1, FSDP2 training of the actor and its reference on ranks 2-3).

A placement never changes results, only time: with the same seed, split logs the same losses, rewards and eval
accuracy as colocate (fp32, relative difference < 1e-5). The samples agree because sampling seeds are global prompt
indices; the weights the rollout set generates with arrive by a VPS plan every step, so a stale or wrong sync would
change the rewards of the next step. No engine process outlives the run and no weight file stays in /dev/shm. The
split run saves a checkpoint after step 2 (the train set's engines, by DCP) and exports the policy; a split run
resumed from that checkpoint logs the uninterrupted run's step 3.

placement.rebalance=true starts a PPO run deliberately unbalanced (3 rollout ranks, 1 train rank, which trains every
row of the step) and the manager moves ranks from generation to training after a measured step (3+1 -> 2+2 or 1+3:
ranks leave the rollout set, so no engine has to start): one VPS move each of the actor's parameters and AdamW moments,
the critic's parameters and AdamW moments, and the reference's parameters. That run, too, logs what colocate logs,
and its trace and timeline show the move. Each comparison runs its own colocate: the re-balancing one with
micro-batches of 1 (training-bound on 3+1 on an idle machine too), the staleness-0 one with 4."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.app.runtimes.test_lend import NO_CLIP, assert_same_metrics
from tests.app.app_runs import read_metrics

GRPO4 = [  # 12 prompts and 12 eval examples divide over 1, 2, 3 and 4 rollout ranks; 48 rows over dp 1, 2, 3 and 4
    "recipe=grpo_tiny", "parallel.world_size=4", "trainer.sft_warmup_steps=30", "trainer.sft_batch_size=16",
    "trainer.precision=fp32",
    "task.prompts_per_step=12", "rollout.n=4", "task.partial_credit=true", "task.eval_size=12", "task.eval_every=2",
    "trainer.total_steps=3", "algorithm.mini_batches=2", "algorithm.epochs=2", "algorithm.micro_batch_size=4",
    "algorithm.kl_coef=0.02",
    "trainer.save_last=false", "trainer.export_policy=false", "tracking.wandb_mode=disabled", *NO_CLIP,
]
# PPO (actor, critic and reference to move); micro-batches of 1 row make training, not generation, the longer phase
# on 3+1 on an idle machine too
PPO4_MB1 = ["recipe=ppo_tiny" if a == "recipe=grpo_tiny" else a.replace("micro_batch_size=4", "micro_batch_size=1")
            for a in GRPO4 if a != "algorithm.kl_coef=0.02"]
REBALANCE = ["placement=split", "placement.max_staleness=0", "placement.rollout_ranks=3", "placement.rebalance=true",
             "placement.rebalance_every=1", "placement.rebalance_margin=0.05"]
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


def kill_marked(run_dir: Path) -> None:
    for pid in with_mark(str(run_dir)):  # a timeout kills only the launcher
        os.kill(pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def no_leftover_processes(tmp_path):
    yield
    for name in ("colocate", "split", "resumed", "rebalance"):
        kill_marked(tmp_path / name)


@pytest.mark.timeout(900)
def test_split_staleness_0_logs_what_colocate_logs(tmp_path):
    colocate = run(tmp_path / "colocate", *GRPO4)
    before = weight_files()
    saving = ["trainer.save_every=2", "trainer.export_policy=true"]  # a checkpoint and an export after step 2
    split = run(tmp_path / "split", *GRPO4, *saving, "placement=split", "placement.max_staleness=0")
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
    assert not any(k.startswith("rebalance/") for r in split for k in r), "a split run without rebalance moved"
    assert (tmp_path / "split" / "transition_trace.json").is_file() and (tmp_path / "split" / "timeline.png").is_file()

    # resumed from the train set's checkpoint of step 2, step 3 is the uninterrupted run's step 3
    step_2 = tmp_path / "split" / "checkpoints" / "step_2"
    resumed = run(tmp_path / "resumed", *GRPO4, "placement=split", "placement.max_staleness=0",
                  f"trainer.resume={step_2}")
    assert [r["step"] for r in resumed] == [3]
    assert_same_metrics([split[-1]], resumed)
    policy = tmp_path / "split" / "policy"  # exported at the end by the train set's first rank
    assert (policy / "config.json").is_file() and list(policy.glob("*.safetensors"))


@pytest.mark.timeout(900)
def test_unbalanced_ppo_split_rebalances_and_logs_what_colocate_logs(tmp_path):
    colocate = run(tmp_path / "colocate", *PPO4_MB1)
    before = weight_files()
    rows = run(tmp_path / "rebalance", *PPO4_MB1, *REBALANCE)
    assert with_mark(str(tmp_path / "rebalance")) == [], "engine or rank processes outlived the run"
    assert weight_files() - before == set(), "the run left its weight files in /dev/shm"

    moves = [r for r in rows if r.get("rebalance/moved")]
    assert len(moves) >= 1, [(r.get("timing_s/gen"), r.get("timing_s/train")) for r in rows]
    first = moves[0]
    assert first["step"] in (1, 2) and first["rebalance/from_rollout_ranks"] == 3
    assert first["rebalance/rollout_ranks"] in (1, 2)  # ranks left generation for training
    assert first["rebalance/predicted_gain_s"] > 0
    assert first["rebalance/predicted_total_gain_s"] > first["rebalance/predicted_cost_s"] > 0
    after = rows[first["step"] + 1]  # the move's cost is logged in the step it served
    assert after["rebalance/transition_seconds"] > 0 and after["rebalance/engine_start_seconds"] == 0.0
    for role in ("actor", "critic", "reference"):  # one VPS move each, 1 train rank -> 2 or 3
        assert after[f"reshard/{role}/rebalance/bytes_moved"] > 0 and after[f"reshard/{role}/rebalance/rounds"] >= 1
    for role in ("actor", "critic"):  # with their AdamW moments
        assert after[f"reshard/{role}/rebalance/bytes_moved"] > 2 * after["reshard/reference/rebalance/bytes_moved"]
    assert any(abs(r["critic/vf_loss"]) > 0 for r in rows[1:])
    assert after["placement/wait_seconds"] <= 0.1 * after["placement/build_seconds"] + 0.01
    assert 0 < after["rebalance/lost_seconds"] <= after["rebalance/transition_seconds"]
    share = after["rebalance/lost_seconds"] / after["timing_s/step"]
    assert after["rebalance/transition_share"] == pytest.approx(share)
    assert "rebalance/measured_gain_s" in after  # the step after a move measures its gain
    assert after["rebalance/rollout_ranks"] <= first["rebalance/rollout_ranks"]  # training-bound: never back to 3

    assert_same_metrics(colocate, rows)  # a placement, and its changes, never change results

    trace = json.loads((tmp_path / "rebalance" / "transition_trace.json").read_text())["traceEvents"]
    events = [e for e in trace if e["ph"] == "X"]
    moved = [e for e in events if e["name"] == "rebalance"]
    assert sorted(e["pid"] for e in moved if e["args"]["from"] == 3) == [0, 1, 2, 3]  # every rank took part
    for role in ("actor", "critic"):  # the train rank sent their state
        assert 3 in {e["pid"] for e in events if e["name"] == f"reshard/{role}/rebalance"}
    served = {(e["pid"], e["name"], e["args"]["roles"]) for e in events
              if e["cat"] == "phase" and e["args"]["step"] == 1}
    assert (0, "phase/generate", "rollout") in served and (3, "phase/train_actor", "actor") in served
    assert (3, "phase/train_critic", "critic") in served
    assert not any(p == 3 and n == "phase/generate" for p, n, _ in served)  # step 1: rank 3 only trained
    assert any(e["name"] == SYNC for e in events)  # the weight syncs' rounds
    assert (tmp_path / "rebalance" / "timeline.png").stat().st_size > 10_000


def test_split_refuses_what_it_does_not_run_before_spawn(tmp_path):
    cmd = [sys.executable, "-m", "rlhf_dyna", *GRPO4, "placement=split", "placement.max_staleness=0",
           "rollout.tp=2", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "placement=split" in proc.stderr and "rollout.tp=2" in proc.stderr, proc.stderr[-2000:]
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
