"""Same seed, same metrics: run a fixed set of short configurations on a commit and compare two commits value for value.

    python scripts/compare_behaviour.py run --out DIR [--commit SHA] [--only NAME,...]
    python scripts/compare_behaviour.py compare DIR_A DIR_B

`run` executes each configuration with the real app (Hydra, spawned gloo ranks, vLLM) and keeps its metrics.jsonl
under DIR/<name>/. With --commit the configurations run on that commit, checked out in a temporary git worktree
that imports its own code with this checkout's virtual environment. `compare` prints, per configuration, whether
every logged value agrees exactly (timings, throughputs and timing-driven decisions aside), the largest relative
difference, and the keys only one side logged. Exit code 1 when any configuration differs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NO_CLIP = ["algorithm.clip_eps_low=1.0", "algorithm.clip_eps_high=1e9", "algorithm.clip_ratio_c=0",
           "algorithm.vf_clip=1e9"]
FOUR = ["parallel.world_size=4", "trainer.sft_warmup_steps=30", "trainer.sft_batch_size=16", "trainer.precision=fp32",
        "task.partial_credit=true", "trainer.save_last=false", "trainer.export_policy=false",
        "tracking.wandb_mode=disabled"]
GRPO4 = ["recipe=grpo_tiny", *FOUR, "task.prompts_per_step=12", "rollout.n=4", "task.eval_size=12",
         "task.eval_every=2", "trainer.total_steps=3", "algorithm.mini_batches=2", "algorithm.epochs=2",
         "algorithm.micro_batch_size=4", "algorithm.kl_coef=0.02", *NO_CLIP]
PPO4 = ["recipe=ppo_tiny", *FOUR, "task.prompts_per_step=8", "rollout.n=4", "task.eval_size=16", "task.eval_every=3",
        "trainer.total_steps=3", *NO_CLIP]
PPO4_MB1 = ["recipe=ppo_tiny", *FOUR, "task.prompts_per_step=12", "rollout.n=4", "task.eval_size=12",
            "task.eval_every=2", "trainer.total_steps=3", "algorithm.mini_batches=2", "algorithm.epochs=2",
            "algorithm.micro_batch_size=1", *NO_CLIP]
RESUMED = ["recipe=grpo_tiny", "trainer.sft_warmup_steps=30", "trainer.sft_batch_size=16", "algorithm.kl_coef=0.05",
           "trainer.precision=fp32", "algorithm.kl_ctrl=adaptive", "algorithm.kl_horizon=200",
           "task.prompts_per_step=8", "rollout.n=4", "task.partial_credit=true", "task.eval_size=16",
           "task.eval_every=2", "tracking.wandb_mode=disabled", "trainer.total_steps=4", "trainer.save_every=2"]

# name -> list of runs; a run is its overrides; "{prev}" stands for the previous run's directory
CONFIGS: dict[str, list[list[str]]] = {
    "grpo_tiny": [["recipe=grpo_tiny", "trainer.total_steps=30", "tracking.wandb_mode=disabled"]],
    "ppo_tiny_lend": [[*PPO4, "placement=lend"]],
    "grpo_split_stale0": [[*GRPO4, "placement=split", "placement.max_staleness=0"]],
    "grpo_split_stale1": [[*GRPO4, "placement=split", "placement.max_staleness=1"]],
    "ppo_split_rebalance": [[*PPO4_MB1, "placement=split", "placement.max_staleness=0", "placement.rollout_ranks=3",
                             "placement.rebalance=true", "placement.rebalance_every=1",
                             "placement.rebalance_margin=0.05"]],
    "grpo_tiny_pp": [["recipe=grpo_tiny_pp", "trainer.total_steps=3", "trainer.sft_warmup_steps=4",
                      "task.eval_size=16", "task.eval_every=1", "task.partial_credit=true",
                      "tracking.wandb_mode=disabled"]],
    "grpo_tiny_moe_ep2": [["recipe=grpo_tiny_moe", "trainer.total_steps=3", "trainer.sft_warmup_steps=2",
                           "task.eval_size=16", "task.eval_every=1", "parallel.train.ep=2",
                           "tracking.wandb_mode=disabled"]],
    "checkpoint_resume": [RESUMED, [*RESUMED, "trainer.resume={prev}/checkpoints/step_2"]],
    "layout_schedule": [["recipe=grpo_tiny", "trainer.total_steps=4", "trainer.sft_warmup_steps=20",
                         "trainer.sft_batch_size=16", "trainer.precision=fp32", "task.prompts_per_step=16",
                         "task.partial_credit=true", "task.eval_size=16", "task.eval_every=100",
                         "algorithm.mini_batches=2", "tracking.wandb_mode=disabled",
                         "parallel.schedule=[{step: 2, tp: 2}, {step: 3, tp: 1, zero: 1}]"]],
}

# values that measure time, or decisions taken from measured times: they differ between any two runs
TIMED_PREFIXES = ("timing_s/", "perf/", "rebalance/")
TIMED_SUFFIXES = ("seconds", "_s", "change_share", "transition_share")
# a re-balanced run moves ranks when measured times say so: the sets it trains on (so the bytes its moves and syncs
# carry, and the fp32 summation order) follow the machine's speed; its values agree to round-off, not bit for bit
DECIDED_BY_TIME = {"ppo_split_rebalance": (1e-5, ("reshard/", "placement/"))}
ATOL = 1e-6  # with rtol: means of terms that cancel to ~0 (advantage/mean) differ by their round-off, not relatively


def is_timed(key: str) -> bool:
    return key.startswith(TIMED_PREFIXES) or key.endswith(TIMED_SUFFIXES)


def worktree(commit: str) -> Path:
    """A detached worktree of `commit`; its `rlhf_dyna.conf` is its own conf/ (the editable install maps it to ours)."""
    path = Path(tempfile.mkdtemp(prefix="rlhf_dyna_compare_"))
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), commit], check=True,
                   capture_output=True)
    (path / "rlhf_dyna" / "conf").symlink_to(path / "conf")
    return path


def run_all(out: Path, commit: str | None, only: list[str]) -> int:
    where = worktree(commit) if commit else REPO
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout
        (out / "commit.txt").write_text(head.strip() + (" + uncommitted changes" if dirty.strip() else "") + "\n")
        for name, runs in CONFIGS.items():
            if only and name not in only:
                continue
            prev = None
            for i, overrides in enumerate(runs):
                run_dir = (out / name / f"run{i}").resolve()
                shutil.rmtree(run_dir, ignore_errors=True)
                args = [a.replace("{prev}", str(prev)) for a in overrides]
                t0 = time.time()
                proc = subprocess.run([sys.executable, "-m", "rlhf_dyna", *args, f"hydra.run.dir={run_dir}"],
                                      cwd=where, capture_output=True, text=True, timeout=1800,
                                      env=dict(os.environ, PYTHONPATH=str(where)))
                (run_dir.parent / f"run{i}.log").write_text(proc.stdout + proc.stderr)
                status = "ok" if proc.returncode == 0 else f"FAILED rc={proc.returncode}"
                print(f"{name} run{i}: {status} in {time.time() - t0:.0f} s", flush=True)
                failed += proc.returncode != 0
                prev = run_dir
    finally:
        if commit:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)], capture_output=True)
    return 1 if failed else 0


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def compare_rows(a: list[dict], b: list[dict], rtol: float = 0.0, skipped: tuple[str, ...] = (),
                 ) -> tuple[int, int, float, set[str], set[str]]:
    """(values compared, values that differ by more than `rtol`, largest relative difference, keys only in a, keys
    only in b); keys starting with `skipped` are left out."""
    compared = differ = 0
    worst = 0.0
    only_a: set[str] = set()
    only_b: set[str] = set()
    if [r["step"] for r in a] != [r["step"] for r in b]:
        return 0, 1, math.inf, {"<steps differ>"}, set()
    for ra, rb in zip(a, b):
        ka = {k for k in ra if not is_timed(k) and not k.startswith(skipped)}
        kb = {k for k in rb if not is_timed(k) and not k.startswith(skipped)}
        only_a |= ka - kb
        only_b |= kb - ka
        for key in sorted(ka & kb):
            compared += 1
            va, vb = ra[key], rb[key]
            if va != vb:
                scale = max(abs(va), abs(vb), 1e-30)
                worst = max(worst, abs(va - vb) / scale)
                differ += abs(va - vb) > rtol * scale + (ATOL if rtol else 0.0)
    return compared, differ, worst, only_a, only_b


def compare(dir_a: Path, dir_b: Path, out: Path | None = None) -> int:
    print(f"A: {dir_a} ({(dir_a / 'commit.txt').read_text().strip()[:10] if (dir_a / 'commit.txt').exists() else '?'})")
    print(f"B: {dir_b} ({(dir_b / 'commit.txt').read_text().strip()[:10] if (dir_b / 'commit.txt').exists() else '?'})")
    bad, report = 0, []
    for name, runs in CONFIGS.items():
        for i in range(len(runs)):
            rel = Path(name) / f"run{i}" / "metrics.jsonl"
            a, b = read_rows(dir_a / rel), read_rows(dir_b / rel)
            if not a or not b:
                print(f"{name}/run{i}: missing ({'A' if not a else 'B'} has no metrics)")
                bad += 1
                continue
            rtol, skipped = DECIDED_BY_TIME.get(name, (0.0, ()))
            n, differ, worst, only_a, only_b = compare_rows(a, b, rtol, skipped)
            same = differ == 0 and not only_a and not only_b
            verdict = ("identical" if worst == 0 else f"equal within rtol {rtol:g}") if same else "DIFFERENT"
            bad += not same
            report.append({"run": f"{name}/run{i}", "verdict": verdict, "values": n, "steps": len(a), "differ": differ,
                           "max_rel": worst, "rtol": rtol, "only_a": sorted(only_a), "only_b": sorted(only_b)})
            print(f"{name}/run{i}: {verdict}: {n} values over {len(a)} steps, {differ} differ "
                  f"(max rel {worst:.2e})" + (f"; only in A: {sorted(only_a)}" if only_a else "")
                  + (f"; only in B: {sorted(only_b)}" if only_b else ""))
    if out is not None:
        commits = [(d / "commit.txt").read_text().strip() if (d / "commit.txt").exists() else "?" for d in (dir_a, dir_b)]
        out.write_text(json.dumps({"a": commits[0], "b": commits[1], "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                   time.gmtime()), "runs": report}, indent=1) + "\n")
    return 1 if bad else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--commit")
    r.add_argument("--only", default="")
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    c.add_argument("--json", type=Path, help="also write the comparison there")
    args = parser.parse_args()
    if args.cmd == "run":
        sys.exit(run_all(args.out, args.commit, [n for n in args.only.split(",") if n]))
    sys.exit(compare(args.a, args.b, args.json))


if __name__ == "__main__":
    main()
