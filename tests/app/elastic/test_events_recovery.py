"""End to end: scripted membership changes and failure recovery in one run (issues 27 and 28; placement=colocate, 4
gloo ranks, grpo_tiny, elastic.replicas=1, snapshots every step; a real `kill -9` at a kill point, elastic/faults.py).

`elastic.events=[leave:1@2,join@4]`, launched rank 3 killed in step 6's weight sync (after the join: world 4 -> 3 ->
4, process 3 is rank 2 of the last two, as the ranks publish on the job's store; the launcher's own numbering would
name rank 3, the joiner): the survivors (processes 0, 2 and the joiner, process 4) recover from the ring over the
regrown world, roll back to step 5 and finish on 3 ranks; exit code 0, each step once, and steps 6-7 equal the run's own step-5 checkpoint
resumed on 3 ranks by `trainer.resume`. Launched rank 1 killed inside the leave's boundary (`leave/move`): the world
record is marked "changing", so the launcher stops the run within seconds, naming the change, with no process and no
/dev/shm entry of the run left, and the checkpoint of the leave's step complete."""
from __future__ import annotations

from pathlib import Path

import pytest

from rlhf_dyna.elastic.faults import KILL_TEXT
from rlhf_dyna.launch.shm import SHM_DIR
from rlhf_dyna.orchestrator.checkpoint_dirs import scan
from tests.app.app_runs import read_metrics
from tests.app.elastic.live_runs import run_with_kill_point
from tests.app.marked_processes import marked_processes
from tests.app.runtimes.placed_runs import GRPO4, assert_same_metrics, kill_marked, run

STEPS = 7
BASE = [a for a in GRPO4 if not a.startswith("trainer.total_steps=")]
REPLICAS = ["elastic.replicas=1", "elastic.snapshot_every=1", "trainer.keep_checkpoints=0"]


@pytest.mark.timeout(900)
def test_a_rank_lost_after_a_leave_and_a_join_is_survived_from_the_regrown_ring(tmp_path: Path) -> None:
    run_dir = tmp_path / "killed"
    code, out, err, _ = run_with_kill_point(run_dir, *BASE, f"trainer.total_steps={STEPS}", *REPLICAS,
                                            "trainer.save_every=5", "elastic.events=[leave:1@2,join@4]",
                                            kill_at="weight_sync/step_6@3")
    assert code == 0, out[-3000:] + err[-3000:]
    assert not marked_processes(str(run_dir))
    assert "rank 2 of 4 lost (process 3)" in err, err[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS + 1))  # each step once: step 6 redone on 3 ranks
    assert [r["elastic/world_size"] for r in rows[1:]] == [4.0, 4.0, 3.0, 3.0, 4.0, 3.0, 3.0]
    assert [r["elastic/snapshot/ring_world"] for r in rows[1:]] == [4.0, 4.0, 3.0, 3.0, 4.0, 3.0, 3.0]
    recovered = rows[6]
    assert recovered["elastic/recovery/source"] == 1.0 and recovered["elastic/recovery/steps_lost"] == 1.0
    assert recovered["elastic/recovery/bytes_moved"] > 0
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "rank 2 of 4 lost during step 6" in log and "rolled back to step 5" in log, log[-3000:]

    reference_dir = tmp_path / "resumed"
    resumed = run(reference_dir, *[a for a in BASE if not a.startswith("parallel.world_size=")],
                  "parallel.world_size=3", f"trainer.total_steps={STEPS}",
                  f"trainer.resume={run_dir / 'checkpoints' / 'step_5'}")
    kill_marked(reference_dir)
    assert any(abs(r["actor/pg_loss"]) > 1e-3 for r in resumed), "no learning signal: equality is vacuous"
    assert_same_metrics(resumed, rows[6:])


@pytest.mark.timeout(600)
def test_a_rank_killed_inside_a_leave_stops_the_run_cleanly(tmp_path: Path) -> None:
    run_dir = tmp_path / "leave"
    code, out, err, seconds = run_with_kill_point(run_dir, *BASE, "trainer.total_steps=4", *REPLICAS,
                                                  "trainer.save_every=1", "elastic.events=[leave:3@2]",
                                                  kill_at="leave/move@1", limit=400)
    assert code != 0, out[-3000:] + err[-3000:]
    assert seconds < 30, f"the stop took {seconds:.1f} s"
    assert "process 1 lost during a membership change of the 4-rank world 0" in err, err[-3000:]
    assert not marked_processes(str(run_dir))
    ident = (run_dir / "logs" / "rank1.log").read_text().split(KILL_TEXT)[1].split(", run ")[1].split(",")[0]
    assert [p.name for p in SHM_DIR.iterdir() if ident in p.name] == []
    complete, _ = scan(run_dir / "checkpoints")
    assert [step for step, _ in complete][-1:] == [2], complete  # the leave's boundary: after step 2's checkpoint
