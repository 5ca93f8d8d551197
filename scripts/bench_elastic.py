"""A rank leaving and a rank joining a live run against the checkpoint-and-restart path, in one script, on 4 -> 3 and
3 -> 4 local gloo ranks (the tiny GRPO recipe, placement=colocate, fp32).

- leave: `elastic.events=[leave:3@2]`; from the step boundary to the first step in the new world is the change's
  `elastic/leave/seconds` (its breakdown: the move over the old world; the new world's groups and meshes, built in the
  background during step 2 (`build_seconds`, off the path), what the boundary waited for that build (`wait_seconds`)
  and spent on the world's groups and meshes in all (`world_seconds`: the wait, then torch taking the groups);
  the engines' local copy; the rollout released, re-formed and synced, `rollout_groups` of vLLM's groups taken from
  the background build) plus step 3's `timing_s/step`.
- restart (the issue's path: save at that step, stop, relaunch with `trainer.resume`, first step done): the same run
  checkpointed after step 2 (`trainer.save_every=2`, its last step), from step 2's metrics row to the launcher's exit
  (the save and the stop), then relaunched on 3 ranks with `trainer.resume` at that checkpoint, from the launch to
  step 3's metrics row (imports, vLLM start-up, the checkpoint load, step 3).
- join: `parallel.world_size=3 elastic.events=[join@2]`; from the step boundary to the first step in the new world is
  the change's `elastic/join/seconds` (its breakdown: the wait for the joiner, which prepared in the background during
  the warm-up and steps 1-2 (`prepare_seconds`, not on the path); the new world's groups and meshes, built in the
  background during step 2 by the ranks and the joiner (`build_seconds`), the boundary's wait for it and its time on
  the world in all (`wait_seconds`, `world_seconds`); the handover; the move; vLLM re-formed over `rollout_groups`
  groups from the build, and synced) plus step
  3's `timing_s/step`; against a
  3-rank run checkpointed after step 2 and relaunched on 4 ranks with `trainer.resume`.

Every path runs `--repeats` times (default 3), one after another; the JSON and the table show the repeat with the
median sum of both ratios, and list every repeat's ratios.

    python scripts/bench_elastic.py --out docs/bench/bench_elastic.json --note "what else ran on the machine"
    python scripts/docs_tables.py        # docs/elastic/benchmarks.md's tables from the JSON

With `--part recovery` (elastic.replicas=1, docs/elastic/recovery.md), on 4 ranks of the same recipe:
- recovery: `kill -9` of rank 2 a moment after step 5 is logged (snapshots every step); from the kill to step 6's
  metrics row of the same run (the survivors' recovery and the step redone), with step 6's breakdown
  `elastic/recovery/{detect,world,move,rollout,snapshot}_seconds`;
- kill and relaunch: the same kill in a run without replicas that checkpoints every 5 steps; from the kill to the
  launcher's exit (the run stops), and from there a relaunch on the 3 ranks left with `trainer.resume` of step 5 to
  step 6's row (the relaunch's imports, vLLM start-up, the checkpoint load, step 6);
- the snapshots' cost: grpo_tiny and ppo_tiny, `--cost-steps` steps each (default 12) with elastic.replicas=0 and
  =1, in `--repeats` A/B pairs (default 3) run back to back, the order alternating from pair to pair: the mean
  iteration of each run (`timing_s/iteration`, steps 3 on: the step with the loop's work after it, the snapshot's copy
  included) and each pair's change; the pair with the median change is shown, every pair listed. Of that pair's run
  with replicas: the snapshot's part on the loop's path after the step (the copy into the own slot files and the wait
  for the previous send: `elastic/snapshot/{copy,wait}_seconds`) and its send, which runs beside the next step
  (`elastic/snapshot/seconds`), over the mean iteration without replicas; the CPU seconds a snapshot costs rank 0's
  Python threads (`cpu_seconds`: the copy and the snapshot thread); rank 0's host memory for the snapshots
  (`host_bytes`: the replica it holds, `peak_host_bytes` while a snapshot is sent) and its own copies' files
  (`disk_bytes`).

    python scripts/bench_elastic.py --part recovery --out docs/bench/bench_recovery.json --note "..."
"""
from __future__ import annotations

import argparse
import json
import os
import signal
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
             "rollout_seconds", "rollout_groups")
JOIN_BREAKDOWN = ("prepare_seconds", "ready_wait_seconds", "build_seconds", "wait_seconds", "world_seconds",
                  "background", "handover_seconds", "move_seconds", "rollout_seconds", "rollout_groups")
THREE = ["trainer.sft_batch_size=12"]  # the warm-up's batch splits over 3 ranks too (only the join's runs start with 3)


def app(run_dir: Path, *args: str) -> subprocess.Popen:
    """The app on RUN, `args` overriding RUN's values of the same keys."""
    given = {a.split("=", 1)[0] for a in args}
    base = [a for a in RUN if a.split("=", 1)[0] not in given]
    return subprocess.Popen([sys.executable, "-m", "rlhf_dyna", *base, *args, f"hydra.run.dir={run_dir}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl's rows; a last line rank 0 is still writing is left out."""
    path = run_dir / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    return out


def finish(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"the app failed (exit code {proc.returncode}):\n{out[-3000:]}")


def change_at_step_3(run_dir: Path, kind: str, breakdown: tuple[str, ...]) -> dict:
    """The change after step 2 (`kind`: leave or join) as step 3 logged it, and the run's world sizes."""
    step3 = rows(run_dir)[3]
    out = {key: step3[f"elastic/{kind}/{key}"] for key in ("seconds", *breakdown, "bytes_moved", "rounds")}
    out["first_step_seconds"] = step3["timing_s/step"]
    out["next_step_seconds"] = rows(run_dir)[4]["timing_s/step"]  # step 4, the new world warm
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
    proc = app(first, *extra, f"parallel.world_size={before}", "trainer.save_every=2", "trainer.total_steps=2")
    row = wait_row(first, 2, proc)  # rank 0 writes the row, then saves the checkpoint and the run stops
    finish(proc)
    save_and_stop = time.monotonic() - row
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
    return {"save_and_stop_seconds": save_and_stop, "launch_to_first_step_seconds": seconds,
            "path_seconds": save_and_stop + seconds}


KILLED, AFTER = 2, 5  # rank 2 killed during step 6
RECOVERY = ["parallel.world_size=4", "trainer.total_steps=8", "elastic.replicas=1"]
RECOVERY_BREAKDOWN = ("detect_seconds", "world_seconds", "move_seconds", "rollout_seconds", "snapshot_seconds")


def announced_pid(run_dir: Path, rank: int, proc: subprocess.Popen, what: str) -> int:
    """A rank's pid from its log: `what` names the line (the replicas' duty line, or vLLM's start)."""
    log = run_dir / "logs" / f"rank{rank}.log"
    while proc.poll() is None:
        for line in (log.read_text() if log.exists() else "").splitlines():
            if f"rank {rank} (pid " in line and what in line:
                return int(line.split("(pid ")[1].split(")")[0])
        time.sleep(0.1)
    raise RuntimeError(f"the app ended before rank {rank} announced its pid")


def rank_pids(proc: subprocess.Popen) -> dict[int, int]:
    """Ranks of a run without replicas: the launcher's children in launch order (forked ranks are its children)."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    return dict(enumerate(sorted(int(c) for c in children)))


def wait_row(run_dir: Path, step: int, proc: subprocess.Popen | None = None, count: int = 1) -> float:
    """time.monotonic() when `count` rows of `step` are in run_dir's metrics (None if the process ended first)."""
    while sum(r["step"] == step for r in rows(run_dir)) < count:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the app ended without step {step} in {run_dir}")
        time.sleep(0.02)
    return time.monotonic()


def recovery_path(tmp: Path) -> dict:
    run_dir = tmp / "recovery"
    proc = app(run_dir, *RECOVERY)
    pid = announced_pid(run_dir, KILLED, proc, "holds the replica")
    wait_row(run_dir, AFTER, proc)
    time.sleep(0.1)  # into step 6 (a step takes ~0.6 s on 4 idle ranks)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    first = wait_row(run_dir, AFTER + 1, proc)
    finish(proc)
    row = next(r for r in rows(run_dir) if r["step"] == AFTER + 1)
    out = {key: row[f"elastic/recovery/{key}"] for key in ("seconds", *RECOVERY_BREAKDOWN, "bytes_moved", "steps_lost")}
    out.update(kill_to_first_step_seconds=first - killed, first_step_seconds=row["timing_s/step"],
               world_size=[r.get("elastic/world_size") for r in rows(run_dir)[1:]])
    return out


def kill_restart_path(tmp: Path) -> dict:
    first_dir, second_dir = tmp / "killed", tmp / "relaunched"
    proc = app(first_dir, "parallel.world_size=4", "trainer.total_steps=8", f"trainer.save_every={AFTER}")
    wait_row(first_dir, AFTER, proc)
    while not (first_dir / "checkpoints" / f"step_{AFTER}").is_dir():
        time.sleep(0.02)
    time.sleep(0.5)
    pid = rank_pids(proc)[KILLED]
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=300)
    stopped = time.monotonic()
    second = app(second_dir, "parallel.world_size=3", "trainer.total_steps=8",
                 f"trainer.resume={first_dir / 'checkpoints' / f'step_{AFTER}'}")
    first = wait_row(second_dir, AFTER + 1, second)
    finish(second)
    return {"stop_seconds": stopped - killed, "relaunch_to_first_step_seconds": first - stopped,
            "kill_to_first_step_seconds": first - killed, "killed_exit_code": proc.returncode}


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def cost_run(tmp: Path, recipe: str, replicas: int, repeat: int, steps: int) -> dict:
    """One run of `recipe` on 4 ranks: its mean iteration (`timing_s/iteration`: the step with the snapshot's copy
    on the loop's path; steps 3 on, the first two pay one-off costs) and, with replicas, the snapshot's figures (rank 0)."""
    run_dir = tmp / f"{recipe}_{replicas}_{repeat}"
    finish(app(run_dir, f"recipe={recipe}", "parallel.world_size=4", f"trainer.total_steps={steps}",
               f"elastic.replicas={replicas}"))
    logged = rows(run_dir)[3:]
    out = {"step_seconds": mean([r["timing_s/iteration"] for r in logged])}
    if replicas:  # the copy and the wait for the previous send are on the loop's path; the send runs beside it
        out["on_path_seconds"] = mean([r["elastic/snapshot/copy_seconds"] + r["elastic/snapshot/wait_seconds"]
                                       for r in logged])
        for name, key in (("snapshot_seconds", "seconds"), ("cpu_seconds", "cpu_seconds")):
            out[name] = mean([r[f"elastic/snapshot/{key}"] for r in logged])
        out["snapshot_bytes"] = logged[-1]["elastic/snapshot/bytes"]
        for key in ("host", "replica", "disk", "peak_host"):
            out[f"{key}_bytes_per_rank"] = logged[-1][f"elastic/snapshot/{key}_bytes"]
    return out


def snapshot_cost(tmp: Path, recipe: str, repeats: int, steps: int) -> dict:
    """`repeats` A/B pairs of runs without and with replicas, back to back, the order alternating (a drift of the
    machine's load falls on both sides); the pair with the median step time change (the lower middle one for an even
    count) is shown, every pair listed."""
    pairs = []
    for repeat in range(repeats):
        order = (0, 1) if repeat % 2 == 0 else (1, 0)
        runs = {replicas: cost_run(tmp, recipe, replicas, repeat, steps) for replicas in order}
        without, with_replicas = runs[0].pop("step_seconds"), runs[1].pop("step_seconds")
        pairs.append({"replicas0_step_seconds": without, "replicas1_step_seconds": with_replicas,
                      "step_time_change": with_replicas / without - 1, **runs[1]})
    out = dict(sorted(pairs, key=lambda p: p["step_time_change"])[(len(pairs) - 1) // 2])
    for key in ("snapshot", "on_path", "cpu"):
        out[f"{key}_over_step"] = out[f"{key}_seconds"] / out["replicas0_step_seconds"]
    out["shown"] = f"the pair with the median step time change of {repeats} A/B pairs"
    out["pairs"] = [{k: p[k] for k in ("replicas0_step_seconds", "replicas1_step_seconds", "step_time_change",
                                       "on_path_seconds", "snapshot_seconds", "cpu_seconds")} for p in pairs]
    return out


def recovery_main(out: Path, load: tuple[float, ...], note: str, repeats: int, steps: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench_recovery_") as tmp:
        recovery = recovery_path(Path(tmp))
        restart = kill_restart_path(Path(tmp))
        costs = {recipe: snapshot_cost(Path(tmp), recipe, repeats, steps) for recipe in ("grpo_tiny", "ppo_tiny")}
    ratio = recovery["kill_to_first_step_seconds"] / restart["kill_to_first_step_seconds"]
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": f"{os.cpu_count()} CPU cores",
              "load_average_at_start": [round(x, 1) for x in load], "note": note,
              "change": f"kill -9 of rank {KILLED} of 4 during step {AFTER + 1}", "recovery": recovery,
              "kill_and_relaunch": restart, "recovery_over_relaunch": ratio, "snapshot_cost": costs}
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"recovery: {recovery['kill_to_first_step_seconds']:.2f} s from the kill to step {AFTER + 1} done ("
          + ", ".join(f"{k} {recovery[k]:.2f}" for k in RECOVERY_BREAKDOWN)
          + f", step {recovery['first_step_seconds']:.2f}); kill and relaunch: "
          f"{restart['kill_to_first_step_seconds']:.2f} s (stop {restart['stop_seconds']:.2f}, relaunch to step "
          f"{AFTER + 1} {restart['relaunch_to_first_step_seconds']:.2f}); ratio {ratio:.2f}")
    for recipe, c in costs.items():
        print(f"{recipe}: step time change of each A/B pair: "
              + ", ".join(f"{100 * p['step_time_change']:+.1f}%" for p in c["pairs"]))
        print(f"{recipe}: iteration {c['replicas0_step_seconds']:.3f} s without replicas, {c['replicas1_step_seconds']:.3f} s "
              f"with ({100 * c['step_time_change']:+.1f}%, the median pair); on the loop's path "
              f"{c['on_path_seconds']:.4f} s "
              f"({100 * c['on_path_over_step']:.1f}% of a step); the send beside it {c['snapshot_seconds']:.3f} s, "
              f"{c['cpu_seconds']:.4f} CPU seconds in all, "
              f"{c['snapshot_bytes'] / 2**20:.2f} MiB moved; per rank "
              f"(rank 0) {c['host_bytes_per_rank'] / 2**20:.2f} MiB host memory (the replica: "
              f"{c['replica_bytes_per_rank'] / 2**20:.2f} MiB), {c['peak_host_bytes_per_rank'] / 2**20:.2f} MiB during a "
              f"send, {c['disk_bytes_per_rank'] / 2**20:.2f} MiB in its own slot files")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--part", choices=("membership", "recovery"), default="membership")
    parser.add_argument("--note", default="", help="what else shared the machine, for the record")
    parser.add_argument("--repeats", type=int, default=3,
                        help="membership: runs of every path; recovery: A/B pairs of the snapshots' cost; the median is shown")
    parser.add_argument("--cost-steps", type=int, default=12, help="recovery: steps of each run of the snapshots' cost")
    args = parser.parse_args()
    load = os.getloadavg()
    if args.part == "recovery":
        return recovery_main(args.out or Path("docs/bench/bench_recovery.json"), load, args.note, args.repeats,
                             args.cost_steps)
    args.out = args.out or Path("docs/bench/bench_elastic.json")
    runs = []
    for _ in range(args.repeats):  # each path's runs one after another, the repeats after that
        with tempfile.TemporaryDirectory(prefix="bench_elastic_") as tmp:
            leave, restart = leave_path(Path(tmp)), restart_path(Path(tmp))
            join, join_restart = join_path(Path(tmp)), restart_path(Path(tmp), 3, 4, *THREE)
        runs.append({"leave": leave, "restart": restart, "join": join, "join_restart": join_restart,
                     "leave_over_restart": leave["boundary_to_first_step_seconds"] / restart["path_seconds"],
                     "join_over_restart": join["boundary_to_first_step_seconds"] / join_restart["path_seconds"]})
    median = sorted(runs, key=lambda r: r["leave_over_restart"] + r["join_over_restart"])[len(runs) // 2]
    leave, restart, join, join_restart = median["leave"], median["restart"], median["join"], median["join_restart"]
    ratio, join_ratio = median["leave_over_restart"], median["join_over_restart"]
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": f"{os.cpu_count()} CPU cores",
              "load_average_at_start": [round(x, 1) for x in load], "note": args.note,
              "change": "rank 3 of 4 leaves after step 2",
              "leave": leave, "restart": restart, "leave_over_restart": ratio,
              "join_change": "1 rank joins 3 after step 2", "join": join, "join_restart": join_restart,
              "join_over_restart": join_ratio, "shown": "the repeat with the median sum of both ratios",
              "repeats": [{k: r[k] for k in ("leave_over_restart", "join_over_restart")} for r in runs]}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("ratios of each repeat (leave, join): " + "; ".join(f"{r['leave_over_restart']:.3f}, {r['join_over_restart']:.3f}"
                                                            for r in runs))
    print(f"leave: {leave['boundary_to_first_step_seconds']:.2f} s from the boundary to step 3 done ("
          + ", ".join(f"{k} {leave[k]:.3f}" for k in BREAKDOWN) + f", step {leave['first_step_seconds']:.2f}); "
          f"restart: {restart['path_seconds']:.2f} s (save and stop {restart['save_and_stop_seconds']:.2f}, relaunch to "
          f"step 3 {restart['launch_to_first_step_seconds']:.2f}); ratio {ratio:.3f}")
    print(f"join: {join['boundary_to_first_step_seconds']:.2f} s from the boundary to step 3 done ("
          + ", ".join(f"{k} {join[k]:.3f}" for k in JOIN_BREAKDOWN) + f", step {join['first_step_seconds']:.2f}; "
          f"prepare_seconds and build_seconds were paid in the background); restart 3 -> 4: "
          f"{join_restart['path_seconds']:.2f} s (save and stop {join_restart['save_and_stop_seconds']:.2f}, relaunch "
          f"to step 3 {join_restart['launch_to_first_step_seconds']:.2f}); ratio {join_ratio:.3f}")


if __name__ == "__main__":
    main()
