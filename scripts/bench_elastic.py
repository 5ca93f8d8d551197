"""A rank leaving and a rank joining a live run against the checkpoint-and-restart path, in one script, on 4 -> 3 and
3 -> 4 local gloo ranks (the tiny GRPO recipe, placement=colocate, fp32).

- leave: `elastic.events=[leave:3@2]`; from the step boundary to the first step in the new world is the change's
  `elastic/leave/seconds` (its breakdown: the move over the old world; the new world's groups and meshes, built in the
  background during step 2 (`build_seconds`, off the path), what the boundary waited for that build (`wait_seconds`)
  and spent on the world's groups and meshes in all (`world_seconds`: the wait, then torch taking the groups);
  the engines' local copy; the rollout released, re-formed and synced) plus step 3's `timing_s/step`.
- restart: the same run checkpointed after step 2 (`trainer.save_every=2`), then relaunched on 3 ranks with
  `trainer.resume` at that checkpoint; from the launch to step 3's metrics row (imports, vLLM start-up, the checkpoint
  load, step 3). The save itself is not counted (in the restart path's favour).
- join: `parallel.world_size=3 elastic.events=[join@2]`; from the step boundary to the first step in the new world is
  the change's `elastic/join/seconds` (its breakdown: the wait for the joiner, which prepared in the background during
  the warm-up and steps 1-2 (`prepare_seconds`, not on the path); the new world's groups and meshes, built in the
  background during step 2 by the ranks and the joiner (`build_seconds`), the boundary's wait for it and its time on
  the world in all (`wait_seconds`, `world_seconds`); the handover; the move; vLLM re-formed and synced) plus step
  3's `timing_s/step`; against a
  3-rank run checkpointed after step 2 and relaunched on 4 ranks with `trainer.resume`.

    python scripts/bench_elastic.py --out docs/bench/bench_elastic.json --note "what else ran on the machine"
    python scripts/docs_tables.py        # docs/elastic.md's table from the JSON
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

RUN = [  # 12 prompts x 4 samples: 48 rows split over dp 4 and 3, the prompts over 4 and 3 rollout replicas
    "recipe=grpo_tiny", "trainer.sft_warmup_steps=30", "trainer.sft_batch_size=16", "trainer.precision=fp32",
    "task.prompts_per_step=12", "rollout.n=4", "task.partial_credit=true", "task.eval_size=12", "task.eval_every=100",
    "algorithm.mini_batches=2", "algorithm.kl_coef=0.02", "trainer.save_last=false",
    "trainer.export_policy=false", "tracking.wandb_mode=disabled", "trainer.total_steps=4",
]
BREAKDOWN = ("move_seconds", "build_seconds", "wait_seconds", "world_seconds", "background", "copy_seconds",
             "rollout_seconds")
JOIN_BREAKDOWN = ("prepare_seconds", "ready_wait_seconds", "build_seconds", "wait_seconds", "world_seconds",
                  "background", "handover_seconds", "move_seconds", "rollout_seconds")
THREE = ["trainer.sft_batch_size=12"]  # the warm-up's batch splits over 3 ranks too (only the join's runs start with 3)


def app(run_dir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlhf_dyna", *RUN, *args, f"hydra.run.dir={run_dir}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def finish(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"the app failed (exit code {proc.returncode}):\n{out[-3000:]}")


def change_at_step_3(run_dir: Path, kind: str, breakdown: tuple[str, ...]) -> dict:
    """The change after step 2 (`kind`: leave or join) as step 3 logged it, and the run's world sizes."""
    step3 = rows(run_dir)[3]
    out = {key: step3[f"elastic/{kind}/{key}"] for key in ("seconds", *breakdown, "bytes_moved", "rounds")}
    out["first_step_seconds"] = step3["timing_s/step"]
    out["boundary_to_first_step_seconds"] = out["seconds"] + out["first_step_seconds"]
    out["world_size"] = [r.get("elastic/world_size") for r in rows(run_dir)[1:]]
    return out


def leave_path(tmp: Path) -> dict:
    finish(app(tmp / "leave", "parallel.world_size=4", "elastic.events=[leave:3@2]"))
    return change_at_step_3(tmp / "leave", "leave", BREAKDOWN)


def join_path(tmp: Path) -> dict:
    finish(app(tmp / "join", *THREE, "parallel.world_size=3", "elastic.events=[join@2]"))
    return change_at_step_3(tmp / "join", "join", JOIN_BREAKDOWN)


def restart_path(tmp: Path, before: int = 4, after: int = 3, *extra: str) -> dict:
    first, second = tmp / f"before{before}", tmp / f"after{after}"
    finish(app(first, *extra, f"parallel.world_size={before}", "trainer.save_every=2", "trainer.total_steps=2"))
    started = time.perf_counter()
    proc = app(second, *extra, f"parallel.world_size={after}", f"trainer.resume={first / 'checkpoints' / 'step_2'}")
    while not any(r["step"] == 3 for r in rows(second)):
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    finish(proc)
    if not any(r["step"] == 3 for r in rows(second)):
        raise RuntimeError(f"the resumed run logged no step 3 in {second}")
    return {"launch_to_first_step_seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/bench/bench_elastic.json"))
    parser.add_argument("--note", default="", help="what else shared the machine, for the record")
    args = parser.parse_args()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench_elastic_") as tmp:
        leave = leave_path(Path(tmp))
        restart = restart_path(Path(tmp))
        join = join_path(Path(tmp))
        join_restart = restart_path(Path(tmp), 3, 4, *THREE)
    ratio = leave["boundary_to_first_step_seconds"] / restart["launch_to_first_step_seconds"]
    join_ratio = join["boundary_to_first_step_seconds"] / join_restart["launch_to_first_step_seconds"]
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": f"{os.cpu_count()} CPU cores",
              "load_average_at_start": [round(x, 1) for x in load], "note": args.note,
              "change": "rank 3 of 4 leaves after step 2",
              "leave": leave, "restart": restart, "leave_over_restart": ratio,
              "join_change": "1 rank joins 3 after step 2", "join": join, "join_restart": join_restart,
              "join_over_restart": join_ratio}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"leave: {leave['boundary_to_first_step_seconds']:.2f} s from the boundary to step 3 done ("
          + ", ".join(f"{k} {leave[k]:.3f}" for k in BREAKDOWN) + f", step {leave['first_step_seconds']:.2f}); "
          f"restart: {restart['launch_to_first_step_seconds']:.2f} s; ratio {ratio:.2f}")
    print(f"join: {join['boundary_to_first_step_seconds']:.2f} s from the boundary to step 3 done ("
          + ", ".join(f"{k} {join[k]:.3f}" for k in JOIN_BREAKDOWN) + f", step {join['first_step_seconds']:.2f}; "
          f"prepare_seconds and build_seconds were paid in the background); restart 3 -> 4: "
          f"{join_restart['launch_to_first_step_seconds']:.2f} s; ratio {join_ratio:.2f}")


if __name__ == "__main__":
    main()
