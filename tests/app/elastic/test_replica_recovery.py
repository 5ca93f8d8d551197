"""End to end: a rank killed with SIGKILL during a step of a live run with elastic.replicas=1 (4 gloo ranks,
placement=colocate) is survived without a restart (orchestrator/recovery.py, launch/lost_ranks.py).

`kill -9` of rank 2 at a random point of step 6 (snapshots every step): the launcher does not stop the run; the three
survivors leave the broken world, rebuild every role's state from their own shards and rank 3's replica of rank 2's,
roll back to the step-5 snapshot, and finish; exit code 0 and no process left. The reference is honest about what
the survivors should reach: the same run's checkpoint of step 5 (written before the kill) resumed on 3 ranks by
`trainer.resume`, whose steps 6-8 must log the same losses, grad norms, rewards, lengths and eval (relative 1e-5).
For grpo_tiny the lost rank then comes back: a new process started at the kill asks to join
(`python -m rlhf_dyna elastic.join=RUN_DIR`), is admitted at a step boundary after the recovery, and the ring is
re-formed over the 4 ranks; then the joiner is killed too (`kill -9` once the second step of the grown world is
logged: the ring's first snapshot is committed), and the run survives that second loss from the ring over the regrown
world (the joiner's shards from rank 0's replica) and ends at world 3, exit 0, each step once. The joiner's
preparation takes 20-60 s on 2 shared cores: the survivors are held (SIGSTOP) from the kill until it is prepared, so
that a short run admits it. The steps after the join have no cheap reference (a 4-rank run resumed from a checkpoint
of the join's step, which would have to be written).
`kill -9` of rank 0 (it writes metrics.jsonl and the console's lines) at a random point of step 6: the survivors
recover as from any other rank's loss (rank 1 held rank 0's replica; the launcher serves the job's store), the old
rank 1 opens the run's sinks as rank 0 of the new world, metrics.jsonl holds each step once (with snapshots every 2
steps the run rolls back to step 4, and the step-5 row the lost rank 0 wrote goes), the console follows the new rank 0,
and the steps from the recovery on equal `trainer.resume` on 3 ranks. Two adjacent ranks killed at once (rank 2 held
rank 1's replica) without a checkpoint stop the run cleanly within a time limit, naming the ranks and what was lost,
with no process left.
With rollout.tp=2 (vLLM's TP groups [0, 1] and [2, 3], reducing over gloo in such a run: launch/shm.vllm_tp_over_gloo)
rank 2 kills itself just before step 3's generation (elastic/faults.kill_point `generate/step_3`), so rank 3 waits for
it in a TP collective of the forward pass (without the gloo path it spins there for ever, in vLLM's shm all-gather):
the watchdog's socket shutdown gets rank 3 out, the 3 survivors start new engines of tp 1 (3 ranks take no tp 2),
and steps 3-4 equal the step-2 checkpoint resumed on 3 ranks at rollout.tp=1."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rlhf_dyna.launch.scratch import scratch_root
from rlhf_dyna.launch.shm import SHM_DIR
from rlhf_dyna.launch.spawn import mapped_shm
from rlhf_dyna.orchestrator.checkpoint_dirs import scan
from tests.app.app_runs import AppProcess, read_metrics
from tests.app.elastic.live_runs import resumed_reference, run_with_kill_point, signal_rank, start, wait_for
from tests.app.elastic.rank_logs import announced_pid
from tests.app.marked_processes import marked_processes
from tests.app.runtimes.placed_runs import GRPO4, assert_same_metrics, kill_marked, run

STEPS, KILL_IN = 8, 6
JOINED_STEPS = 11  # the recovery redoes step 6; the join comes after step 6 or 7, the joiner's kill 2 steps later
ARGS = [a for a in GRPO4 if not a.startswith("trainer.total_steps=")] + [f"trainer.total_steps={STEPS}"]
REPLICA_DUTY = "holds the replica"  # the line a rank announces its pid on (orchestrator/recovery.Recovery)
REPLICAS = ["elastic.replicas=1", "elastic.snapshot_every=1", f"trainer.save_every={KILL_IN - 1}",
            "trainer.keep_checkpoints=0"]
REFERENCE: dict[str, list[dict]] = {}  # recipe -> the step-5 checkpoint resumed on 3 ranks: the same for every kill


def logged(run_dir: Path, step: int) -> bool:
    path = run_dir / "metrics.jsonl"
    return path.exists() and any(json.loads(line)["step"] >= step for line in path.read_text().splitlines() if line)


def run_and_kill(run_dir: Path, ranks: tuple[int, ...], after_step: int, at: float, *args: str,
                 limit: float = 600, checkpoint: int | None = -1, duty: str = REPLICA_DUTY,
                 env: dict | None = None, after_kill=None,
                 before_kill=None) -> tuple[subprocess.CompletedProcess, float]:
    """The app, with `ranks` killed (SIGKILL) once step `after_step` is logged and the checkpoint of step `checkpoint`
    (-1: `after_step`; None: none) is complete, `at` x that step's time later (a point inside the next step), right
    after `before_kill()` and before `after_kill()`; the finished process and the seconds from the kill to the
    launcher's exit."""
    proc = start(run_dir, *args, env=env)
    checkpoint = after_step if checkpoint == -1 else checkpoint
    try:
        deadline = time.monotonic() + limit
        pids = [announced_pid(run_dir, r, deadline, duty) for r in ranks]
        wait_for(lambda: logged(run_dir, after_step) and (
            checkpoint is None or (run_dir / "checkpoints" / f"step_{checkpoint}").is_dir()),
            f"step {after_step} and the checkpoint of step {checkpoint}", deadline)
        step_seconds = next(r for r in read_metrics(run_dir) if r["step"] == after_step)["timing_s/step"]
        time.sleep(at * step_seconds)
        if before_kill is not None:
            before_kill()
        killed = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        if after_kill is not None:
            after_kill()
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - killed
    finally:
        kill_marked(run_dir)  # a hung run: the launcher's stacks too (its working directory marks it)
        if proc.poll() is None:
            proc.kill()


def grown_for(run_dir: Path, steps: int) -> bool:
    """metrics.jsonl has `steps` rows logged in the regrown 4-rank world (a line being written is skipped)."""
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return sum(r["step"] > KILL_IN and r.get("elastic/world_size") == 4.0 for r in rows) >= steps


def rejoin(run_dir: Path, output: Path, started: list, survivors: list[int]) -> None:
    """A process that asks the running job to join, as a user starts it in a second terminal; the survivors' process
    groups held (SIGSTOP) until it is prepared."""
    for pid in survivors:
        os.killpg(os.getpgid(pid), signal.SIGSTOP)
    try:
        started.append(AppProcess(f"elastic.join={run_dir}", f"hydra.run.dir={output.parent / 'joiner'}", cwd=run_dir,
                                  output=output))  # marked as the job's processes are: by its working directory
        wait_for(lambda: "prepared in" in output.read_text() or started[0].poll() is not None, "the joiner prepared",
                 time.monotonic() + 300)
    finally:
        for pid in survivors:
            os.killpg(os.getpgid(pid), signal.SIGCONT)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("recipe", ["grpo_tiny", "ppo_tiny"])
def test_a_rank_killed_during_a_step_is_survived_from_the_replicas(tmp_path: Path, recipe: str) -> None:
    """PPO: the critic's parameters and AdamW moments are rebuilt too. GRPO: the world regrows by a join."""
    regrow = recipe == "grpo_tiny"
    steps = JOINED_STEPS if regrow else STEPS
    args = [f"recipe={recipe}" if a == "recipe=grpo_tiny" else a for a in ARGS if not a.startswith("trainer.total")]
    args.append(f"trainer.total_steps={steps}")
    run_dir, at, joiners = tmp_path / "killed", random.Random().uniform(0.05, 0.7), []

    def after_kill() -> None:  # the joiner, then its kill once the ring over the grown world holds a snapshot
        survivors = [announced_pid(run_dir, r, time.monotonic() + 10, REPLICA_DUTY) for r in (0, 1, 3)]
        rejoin(run_dir, tmp_path / "joiner.out", joiners, survivors)
        wait_for(lambda: grown_for(run_dir, 2) or joiners[0].poll() is not None, "two steps in the grown world",
                 time.monotonic() + 300)
        os.kill(int((tmp_path / "joiner.out").read_text().split("request0 (pid ")[1].split(")")[0]), signal.SIGKILL)

    try:
        done, _ = run_and_kill(run_dir, (2,), KILL_IN - 1, at, *args, *REPLICAS,
                               after_kill=after_kill if regrow else None)
        if joiners:
            joiners[0].wait(timeout=120)
    finally:
        for proc in joiners:
            if proc.poll() is None:
                proc.kill()
        kill_marked(run_dir)
    assert done.returncode == 0, f"killed at {at:.2f} of a step\n" + done.stdout[-3000:] + done.stderr[-3000:]
    assert not marked_processes(str(run_dir))
    assert "rank 2 of 4 lost" in done.stderr
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(steps + 1))  # each step once: a redone step's row replaces its own
    sizes = [r.get("elastic/world_size") for r in rows[KILL_IN:]]
    if regrow:
        out = (tmp_path / "joiner.out").read_text()
        assert joiners[0].returncode == -9, out[-3000:]
        back = KILL_IN + sizes.index(4.0)  # the first step in the regrown world
        grown = sizes.count(4.0)  # its steps logged before the joiner's loss (each once: the redone ones on 3 ranks)
        assert KILL_IN < back < steps and sizes == [3.0] * (back - KILL_IN) + [4.0] * grown + \
            [3.0] * (steps - back - grown + 1), sizes
        assert rows[back]["elastic/join/bytes_moved"] > 0 and rows[back]["elastic/join/seconds"] > 0
        # the ring over the grown world: a snapshot at once, the joiner's shards' replicas sent with the next step
        assert rows[back]["elastic/snapshot/ring_world"] == 4.0 and rows[back + 1]["elastic/snapshot/bytes"] > 0
        assert f"elastic/join/+1@{back - 1}: 1 rank joins (3 -> 4 ranks)" in (run_dir / "logs" / "rank0.log").read_text()
        # the second loss: the joiner (rank 3 of the grown world), its shards from rank 0's replica on the 4-rank ring
        assert "rank 3 of 4 lost (process request0)" in done.stderr, done.stderr[-3000:]
        second = rows[back + grown]
        assert second["elastic/recovery/source"] == 1.0 and second["elastic/recovery/bytes_moved"] > 0
        assert f"rolled back to step {back + grown - 1}" in (run_dir / "logs" / "rank0.log").read_text()
        rows = rows[:back]  # compared below: the steps in the 3-rank world
    else:
        assert sizes == [3.0] * (STEPS - KILL_IN + 1)
    first = rows[KILL_IN]
    assert first["elastic/recovery/steps_lost"] == 1.0 and first["elastic/recovery/source"] == 1.0
    assert first["elastic/recovery/bytes_moved"] > 0 and first["elastic/recovery/seconds"] > 0
    assert all(r["elastic/snapshot/bytes"] > 0 for r in rows[1:])
    # host memory per rank: one shard, the predecessor's replica; its own copy is on node-local disk
    assert all(r["elastic/snapshot/host_bytes"] == r["elastic/snapshot/replica_bytes"] > 0 for r in rows[1:]), rows[1]
    assert all(r["elastic/snapshot/disk_bytes"] >= r["elastic/snapshot/replica_bytes"] for r in rows[1:]), rows[1]
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert f"lost during step {KILL_IN}" in log and f"rolled back to step {KILL_IN - 1}" in log

    resumed = resumed_on_3(tmp_path, recipe, args, run_dir / "checkpoints" / f"step_{KILL_IN - 1}")
    assert_same_metrics(resumed[:len(rows) - KILL_IN], rows[KILL_IN:STEPS + 1])


def resumed_on_3(tmp_path: Path, recipe: str, args: list[str], checkpoint: Path) -> list[dict]:
    """`trainer.resume` of a 4-rank run's checkpoint on 3 ranks to step STEPS: the rows after it (run once per recipe;
    every run of these arguments writes the same checkpoint)."""
    if recipe not in REFERENCE:
        reference_dir = tmp_path / "resumed"
        REFERENCE[recipe] = run(reference_dir, *[a for a in args if not a.startswith(("parallel.world_size=",
                                                                                        "trainer.total"))],
                                "parallel.world_size=3", f"trainer.total_steps={STEPS}", f"trainer.resume={checkpoint}")
        kill_marked(reference_dir)
    assert any(abs(r["actor/pg_loss"]) > 1e-3 for r in REFERENCE[recipe]), "no learning signal: equality is vacuous"
    return REFERENCE[recipe]


@pytest.mark.timeout(600)
def test_two_adjacent_ranks_lost_without_a_checkpoint_stop_the_run_cleanly(tmp_path: Path) -> None:
    run_dir = tmp_path / "two"
    done, seconds = run_and_kill(run_dir, (1, 2), 2, 0.3, *[a for a in ARGS if not a.startswith("trainer.total_steps")],
                                 "trainer.total_steps=40", *REPLICAS[:2], "trainer.save_every=0", limit=400,
                                 checkpoint=None)
    assert done.returncode != 0
    assert seconds < 30, f"the stop took {seconds:.1f} s"
    assert "rank 1 (process 1), rank 2 (process 2) of 4 lost at once" in done.stderr, done.stderr[-3000:]
    assert "rank 1's shard of every training role's state (its replica was on rank 2, lost too)" in done.stderr
    assert f"no complete checkpoint is under {run_dir / 'checkpoints'} to load in place" in done.stderr
    assert not marked_processes(str(run_dir))


def redone(run_dir: Path, step: int) -> bool:
    """metrics.jsonl has a row of `step` logged in the 3-rank world (a line being written is skipped)."""
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row["step"] == step and row.get("elastic/world_size") == 3.0:
            return True
    return False


@pytest.mark.timeout(900)
@pytest.mark.parametrize("every", [1, 2], ids=["snapshot_every_1", "snapshot_every_2"])
def test_rank_0_killed_during_a_step_is_survived_and_its_successor_writes_the_metrics(tmp_path: Path,
                                                                                     every: int) -> None:
    """kill -9 of rank 0 at a random point of step 6. Snapshots every step: the survivors roll back to step 5 and
    steps 6-8 equal the step-5 checkpoint resumed on 3 ranks (the reference of the rank-2 kill). Every 2 steps: they
    roll back to step 4, so the step-5 row the lost rank 0 wrote must go; step 5 is redone on 3 ranks and steps 5-8
    equal the step-4 checkpoint resumed on 3 ranks."""
    run_dir, at, seen = tmp_path / "zero", random.Random().uniform(0.05, 0.7), {}
    back_to = KILL_IN - every
    extra = [f"elastic.snapshot_every={every}", f"trainer.save_every={back_to}"]
    args = [*ARGS, *[a for a in REPLICAS if not a.startswith(("elastic.snapshot_every=", "trainer.save_every="))],
            *extra]

    def before_kill() -> None:  # what the run has mapped, written and logged when rank 0 dies
        seen["shm"] = mapped_shm(marked_processes(str(run_dir)))
        seen["scratch"] = sorted(p.name for p in scratch_root(json.loads((run_dir / "join.json").read_text())[
            "run_ident"]).iterdir())
        seen["rows"] = read_metrics(run_dir)
        seen["killed"] = time.monotonic()

    def after_kill() -> None:  # measured: from the kill to step 6 logged by the new rank 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not redone(run_dir, KILL_IN):
            time.sleep(0.02)
        seen["to_step"] = time.monotonic() - seen["killed"]

    done, _ = run_and_kill(run_dir, (0,), KILL_IN - 1, at, *args, checkpoint=back_to, before_kill=before_kill,
                           after_kill=after_kill)
    print(f"rank 0 killed at {at:.2f} of step {KILL_IN}: step {KILL_IN} logged by the new rank 0 "
          f"{seen['to_step']:.2f} s after the kill; /dev/shm files mapped at the kill: {len(seen['shm'])}")
    assert done.returncode == 0, f"killed at {at:.2f} of a step\n" + done.stdout[-3000:] + done.stderr[-3000:]
    assert not marked_processes(str(run_dir))
    ident = json.loads((run_dir / "join.json").read_text())["run_ident"]
    left = [p.name for p in SHM_DIR.iterdir() if ident in p.name or p in seen["shm"]]
    assert left == [], f"the run left /dev/shm entries {left} (mapped at the kill: {sorted(seen['shm'])})"
    # every rank's snapshot files were on node-local disk; the killed rank 0's too are gone with the run
    assert seen["scratch"] == ["rank0", "rank1", "rank2", "rank3"] and not scratch_root(ident).exists()
    assert "rank 0 of 4 lost (process 0); the survivors rebuild its state from the replicas" in done.stderr
    # metrics.jsonl: each step once; the rows the lost rank 0 wrote past the rollback went (every=2: step 5's)
    assert [r["step"] for r in seen["rows"]][-1] == KILL_IN - 1, "rank 0 had logged step 5 when it was killed"
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS + 1)), [r["step"] for r in rows]
    assert [r.get("elastic/world_size") for r in rows[back_to + 1:]] == [3.0] * (STEPS - back_to)
    first = rows[back_to + 1]
    assert first["elastic/recovery/steps_lost"] == float(KILL_IN - back_to), first
    assert first["elastic/recovery/source"] == 1.0 and first["elastic/recovery/bytes_moved"] > 0
    log = (run_dir / "logs" / "rank1.log").read_text()  # the old rank 1 is rank 0 of the new world
    assert (f"rank 0 of 4 lost during step {KILL_IN}" in log and f"rolled back to step {back_to}" in log
            and "rank 1 is rank 0 now and writes the run's metrics" in log), log[-3000:]
    # the console shows the new rank 0's lines: its recovery line and the step lines to the end
    assert f"rank 0 of 4 lost during step {KILL_IN}" in done.stdout and f"step {STEPS}/{STEPS} |" in done.stdout, \
        done.stdout[-3000:]

    checkpoint = run_dir / "checkpoints" / f"step_{back_to}"
    if every == 1:
        resumed = resumed_on_3(tmp_path, "grpo_tiny", ARGS, checkpoint)
    else:  # a checkpoint of the rollback's step, written by the 4 ranks before the kill
        reference_dir = tmp_path / "resumed"
        resumed = run(reference_dir, *[a for a in ARGS if not a.startswith("parallel.world_size=")],
                      "parallel.world_size=3", f"trainer.resume={checkpoint}")
        kill_marked(reference_dir)
        assert any(abs(r["actor/pg_loss"]) > 1e-3 for r in resumed), "no learning signal: equality is vacuous"
    assert_same_metrics(resumed, rows[back_to + 1:])


@pytest.mark.timeout(600)
def test_a_rank_killed_while_a_checkpoint_is_written_leaves_the_previous_one_usable(tmp_path: Path) -> None:
    """kill -9 of rank 2 the moment step 4's checkpoint starts (its step_4.tmp dir appears): the survivors recover,
    finish the run (exit 0), step 2's checkpoint stays complete, and the run's later checkpoints are complete."""
    run_dir = tmp_path / "saving"
    started = (run_dir / "checkpoints" / "step_4.tmp").is_dir
    done = signal_rank(run_dir, [*ARGS, *REPLICAS[:2], "trainer.save_every=2", "trainer.keep_checkpoints=0"], 2,
                       REPLICA_DUTY, lambda deadline: wait_for(started, "step 4's checkpoint started", deadline),
                       signal.SIGKILL, limit=500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not marked_processes(str(run_dir))
    complete, _ = scan(run_dir / "checkpoints")
    steps = [step for step, _ in complete]
    assert {2, 6, 8} <= set(steps), steps
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(STEPS + 1))


@pytest.mark.timeout(600)
def test_a_rank_lost_with_rollout_tp_2_is_survived_over_gloo(tmp_path: Path) -> None:
    steps, kill_in, run_dir = 4, 3, tmp_path / "tp2"
    args = [a for a in ARGS if not a.startswith("trainer.total_steps")] + [f"trainer.total_steps={steps}"]
    code, out, err, _ = run_with_kill_point(run_dir, *args, "rollout.tp=2", *REPLICAS[:2],
                                            f"trainer.save_every={kill_in - 1}", "trainer.keep_checkpoints=0",
                                            kill_at=f"generate/step_{kill_in}@2", limit=400)
    assert code == 0, out[-3000:] + err[-3000:]
    assert not marked_processes(str(run_dir)) and "rank 2 of 4 lost" in err
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(steps + 1))
    assert [r["elastic/world_size"] for r in rows[1:]] == [4.0, 4.0, 3.0, 3.0]
    assert rows[kill_in]["elastic/recovery/source"] == 1.0 and rows[kill_in]["elastic/recovery/steps_lost"] == 1.0
    log = (run_dir / "logs" / "rank3.log").read_text()
    assert "rlhf_dyna: vLLM's tp:0 group reduces over gloo, not its shm ring" in log, log[-3000:]

    resumed = resumed_reference(tmp_path, run_dir, args, 3, kill_in - 1)
    assert_same_metrics(resumed, rows[kill_in:])
