"""End to end: ranks leave a live run (placement=colocate, 4 -> 3 gloo ranks) at a step boundary, by schedule
(`elastic.events=[leave:1@2]`, rank 0 too: `leave:0@2`) and by a real `kill -TERM` of one rank's process
(elastic.leave_on_sigterm=true). A scripted leave enters a new world whose groups were built in the background during
step 2 (`elastic/leave/background` 1, on the trace); a SIGTERM leave, known only at its boundary, builds it there.

The run goes on without a restart, ends with exit code 0, leaves no process behind, logs the world size dropping and
the change's metrics, and logs the same per-step losses, grad norms, rewards and eval as a run whose world never
changed (relative 1e-5): the steps after the change train from the moved parameters and AdamW moments, so a moved
value that differs shows up in the next step's losses and grad norm. The bytes moved equal the planner's minimum for
the change, as the dry run of the same command reports it. A leave whose new world the global batch does not split over is
refused at the boundary with a message, and the run goes on in the old world. PPO's leave (the critic moves too) is
checked by test_live_join.py's PPO run, which leaves before it joins.
"""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.app.app_runs import read_metrics, run_cli
from tests.app.elastic.live_runs import signal_rank
from tests.app.marked_processes import marked_processes
from tests.app.runtimes.placed_runs import GRPO4, assert_same_metrics, kill_marked, run

STEPS = 4
ARGS = [a for a in GRPO4 if not a.startswith("trainer.total_steps=")] + [f"trainer.total_steps={STEPS}"]
LEAVE = "elastic.events=[leave:1@2]"  # a middle rank: the survivors 0, 2, 3 become 0, 1, 2


@pytest.fixture
def fixed(grpo4_colocate) -> list[dict]:
    """The run whose world stays 4 ranks throughout: the session's 8-step run (tests/app/conftest.py), its steps 0-4."""
    return grpo4_colocate[:STEPS + 1]


def assert_left_at(rows: list[dict], step: int) -> None:
    """World size 4 up to `step`, 3 after; the change's metrics on the first step of the new world."""
    assert [r.get("elastic/world_size") for r in rows[1:]] == [4.0 if s <= step else 3.0 for s in range(1, STEPS + 1)]
    change = rows[step + 1]
    assert change["elastic/leave/seconds"] > 0 and change["elastic/leave/rounds"] >= 1
    assert change["elastic/leave/bytes_moved"] > 0
    assert not any(k.startswith("elastic/leave/") for r in rows if r["step"] != step + 1 for k in r)


@pytest.mark.timeout(900)
def test_a_scripted_leave_changes_nothing_but_the_world(fixed, tmp_path: Path) -> None:
    run_dir = tmp_path / "left"
    try:
        left = run(run_dir, *ARGS, LEAVE)
    finally:
        kill_marked(run_dir)
    assert not marked_processes(str(run_dir))
    assert any(abs(r["actor/pg_loss"]) > 1e-3 for r in fixed[1:]), "no learning signal: equality would be vacuous"
    assert_same_metrics(fixed, left)
    assert_left_at(left, 2)
    assert "rank 1 left the job after sending its state" in (run_dir / "logs" / "rank1.log").read_text()
    assert_built_in_background(left[3], run_dir, "elastic/leave/1@2")

    dry = run_cli(*ARGS, LEAVE, "dry_run=true", tmp_path=tmp_path / "dry")
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    planned = next(r for r in json.loads((tmp_path / "dry" / "run" / "plan_summary.json").read_text())["transitions"]
                   if r["transition"] == "elastic/leave/1@2")
    assert left[3]["elastic/leave/bytes_moved"] == planned["bytes_min"] == planned["bytes_moved"]
    assert set(planned["roles"]) == {"actor", "reference"}  # kl_coef > 0: the reference's parameters move too


def assert_built_in_background(row: dict, run_dir: Path, name: str) -> None:
    """The new world's groups and meshes were built in the background, and the build is on the run's trace."""
    assert row["elastic/leave/background"] == 1.0
    assert row["elastic/leave/wait_seconds"] <= 0.1 * row["elastic/leave/build_seconds"], "the build was not hidden"
    assert row["elastic/leave/world_seconds"] > row["elastic/leave/wait_seconds"]
    assert row["elastic/leave/rollout_groups"] == 12  # vLLM's world, TP, DCP, PCP, PP, DP: device and cpu group each
    trace = json.loads((run_dir / "transition_trace.json").read_text())["traceEvents"]
    assert {f"{name}/build", f"{name}/world"} <= {e["name"] for e in trace}


@pytest.mark.timeout(900)
def test_rank_0_leaves_and_its_successor_writes_the_metrics(fixed, tmp_path: Path) -> None:
    """The job's store is the launcher's: rank 0 may leave; the old rank 1, now rank 0, logs the steps after it."""
    run_dir = tmp_path / "rank0"
    try:
        left = run(run_dir, *ARGS, "elastic.events=[leave:0@2]")
    finally:
        kill_marked(run_dir)
    assert not marked_processes(str(run_dir))
    assert_same_metrics(fixed, left)
    assert_left_at(left, 2)
    assert "rank 0 left the job after sending its state" in (run_dir / "logs" / "rank0.log").read_text()
    assert "elastic/leave/0@2: rank 0 leaves (4 -> 3 ranks)" in (run_dir / "logs" / "rank1.log").read_text()
    assert_built_in_background(left[3], run_dir, "elastic/leave/0@2")


@pytest.mark.timeout(900)
def test_tensor_parallel_training_and_rollout_lose_two_ranks_and_keep_their_tp(fixed, tmp_path: Path) -> None:
    """dp2 x tp2 training and rollout.tp=2, ranks 1-2 leave: training goes dp2 x tp2 -> dp1 x tp2 over the survivors
    0 and 3 (a tp group of ranks that were in two), and their kept vLLM engines, each from another TP group, form one
    TP group; the same metrics as the dp4 / tp1 run that never changed (tp's summation order differs by ~1e-7)."""
    run_dir = tmp_path / "tp2"
    try:
        left = run(run_dir, *ARGS, "parallel.train.tp=2", "rollout.tp=2", "elastic.events=[leave:1-2@2]")
    finally:
        kill_marked(run_dir)
    assert_same_metrics(fixed, left)
    assert [r.get("elastic/world_size") for r in left[1:]] == [4.0, 4.0, 2.0, 2.0]
    assert left[3]["elastic/leave/rollout_groups"] == 12  # the kept engines' groups at tp 2 came from the build
    assert "training layout dp1xtp2-zero3" in (run_dir / "logs" / "rank0.log").read_text()


def wait_for_step(run_dir: Path, step: int, deadline: float) -> None:
    metrics = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and any(json.loads(line)["step"] >= step for line in metrics.read_text().splitlines()):
            return
        time.sleep(0.1)
    raise TimeoutError(f"no step {step} in {metrics}")


def run_with_sigterm(run_dir: Path, rank: int, *args: str) -> list[dict]:
    """The app with elastic.leave_on_sigterm=true; `kill -TERM` of `rank` once step 1 is logged; its metrics rows."""
    done = signal_rank(run_dir, [*args, "elastic.leave_on_sigterm=true"], rank, "SIGTERM",
                       lambda deadline: wait_for_step(run_dir, 1, deadline),  # step 1 logged: step 2 or 3 is its last
                       signal.SIGTERM)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not marked_processes(str(run_dir))
    return read_metrics(run_dir)


@pytest.mark.timeout(900)
def test_a_rank_that_receives_sigterm_leaves_at_the_next_boundary(fixed, tmp_path: Path) -> None:
    run_dir = tmp_path / "sigterm"
    rows = run_with_sigterm(run_dir, 2, *ARGS)
    left_after = next(r["step"] for r in rows[1:] if r["elastic/world_size"] == 3.0) - 1
    assert left_after in (1, 2, 3)
    assert_left_at(rows, left_after)
    change = rows[left_after + 1]  # known only at its boundary: built there
    assert change["elastic/leave/background"] == 0.0
    assert change["elastic/leave/wait_seconds"] == change["elastic/leave/build_seconds"] == \
        change["elastic/leave/world_seconds"] > 0
    assert change["elastic/leave/rollout_groups"] == 0.0  # vLLM's groups too
    assert_same_metrics(fixed, rows)
    assert f"elastic/leave/2@{left_after}: rank 2 left the job" in (run_dir / "logs" / "rank2.log").read_text()


@pytest.mark.timeout(900)
def test_a_leave_the_global_batch_does_not_split_over_is_refused_and_the_run_goes_on(tmp_path: Path) -> None:
    run_dir = tmp_path / "refused"
    steps = 8  # the kill lands after step 1 is logged; a loaded machine must still have a boundary left after it
    args = [a for a in ARGS if not a.startswith(("task.prompts_per_step=", "task.eval_size=", "trainer.total_steps="))]
    rows = run_with_sigterm(run_dir, 3, *args, "task.prompts_per_step=8", "task.eval_size=8",  # 32 rows, 3 x 2 shards
                            f"trainer.total_steps={steps}", "task.eval_every=100")
    assert [r.get("elastic/world_size") for r in rows[1:]] == [4.0] * steps
    assert not any(k.startswith("elastic/leave/") for r in rows for k in r)
    refusal = [line for line in (run_dir / "logs" / "rank3.log").read_text().splitlines() if "refused" in line]
    assert len(refusal) == 1, refusal
    assert "refused, the run goes on with 4 ranks: rank 3 leaves (4 -> 3 ranks): the actor would train with dp=3" \
        in refusal[0] and "use e.g. task.prompts_per_step=24" in refusal[0]
