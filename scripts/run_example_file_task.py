"""Run `task=file` on the shipped example data with a tiny local HF checkpoint and record what happened.

    python scripts/run_example_file_task.py --out docs/bench/file_task_example.json

Makes a tiny Llama checkpoint (random weights, locally trained BPE, ChatML template) in a temp dir, runs
GRPO for a few steps on examples/data/arith_chat_{train,eval}.jsonl with task.reward=math, and writes the
wall time, the machine and the logged metrics. Random weights: rewards stay ~0; this shows the pipeline runs.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/bench/file_task_example.json")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_tiny_checkpoint(Path(tmp) / "ckpt")
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "rlhf_dyna", "task=file", f"model.path={ckpt}", "task.reward=math",
               f"trainer.total_steps={args.steps}", "trainer.sft_warmup_steps=0", "task.prompts_per_step=8",
               "rollout.n=4", "rollout.max_new_tokens=16", "task.eval_size=16", f"task.eval_every={args.steps}",
               "task.max_prompt_tokens=200", "tracking.wandb_mode=disabled", f"hydra.run.dir={run_dir}"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode:
            sys.exit(f"run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    record = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "command": " ".join(cmd[1:]).replace(str(ckpt), "TINY_CKPT").replace(str(run_dir), "RUN_DIR"),
        "wall_s": round(wall, 1), "steps": args.steps,
        "final": {k: rows[-1][k] for k in ("reward/mean", "reward/math/mean", "eval/accuracy", "eval/reward",
                                           "response_length/mean", "timing_s/step") if k in rows[-1]},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
