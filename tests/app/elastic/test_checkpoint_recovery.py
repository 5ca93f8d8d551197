"""End to end: lost ranks whose state no surviving replica holds are survived from the newest complete checkpoint in
place, without a restart (orchestrator/checkpoint_recovery.py, launch/lost_ranks.py); a failure during a recovery
stops the run cleanly; a rank killed inside a weight sync is survived from the replicas (dp4, and pp2 x dp2 into dp3). Real `kill -9` of real ranks
(4 gloo ranks, placement=colocate); the moments a test cannot hit from outside are kills the rank makes on itself
(elastic/faults.kill_point, RLHF_DYNA_KILL_AT).

Ranks 1 and 2 killed at once during step 4 (checkpoints every 2 steps): with elastic.replicas=1 rank 1's replica was
on rank 2, lost too; with elastic.replicas=0 and elastic.recover_from_checkpoint=true nothing holds them; ranks 0 and
1 with replicas (rank 0's replica was on rank 1): the old rank 2 leads as rank 0. Each way the two survivors load
step 2's checkpoint into empty engines on their world, roll back to step 2 and finish with exit code 0, and steps 3-5
log the same losses, grad norms, rewards, lengths and eval (relative 1e-5) as `trainer.resume` of that checkpoint on 2
ranks (one reference run for all three)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlhf_dyna.elastic.faults import KILL_ENV, KILL_TEXT
from rlhf_dyna.launch.shm import SHM_DIR
from rlhf_dyna.orchestrator.checkpoint_dirs import scan
from tests.app.app_runs import read_metrics
from tests.app.elastic.live_runs import start
from tests.app.elastic.test_replica_recovery import REPLICA_DUTY, run_and_kill
from tests.app.marked_processes import marked_processes
from tests.app.runtimes.placed_runs import GRPO4, assert_same_metrics, kill_marked, run

STEPS, EVERY = 5, 2
ARGS = [a for a in GRPO4 if not a.startswith("trainer.total_steps=")] + [
    f"trainer.total_steps={STEPS}", f"trainer.save_every={EVERY}", "trainer.keep_checkpoints=0"]
CHECKPOINT_DUTY = "survives a lost rank"  # the line a rank announces its pid on without replicas
MODES = {"replicas": (["elastic.replicas=1", "elastic.snapshot_every=1"], REPLICA_DUTY),
         "no_replicas": (["elastic.replicas=0", "elastic.recover_from_checkpoint=true"], CHECKPOINT_DUTY)}
REFERENCE: dict[str, list[dict]] = {}  # trainer.resume of step 2's checkpoint on 2 ranks: the same for both modes


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode, ranks", [("replicas", (1, 2)), ("no_replicas", (1, 2)), ("replicas", (0, 1))],
                         ids=["replicas", "no_replicas", "replicas_rank_0"])
def test_ranks_lost_with_no_replica_of_their_state_are_survived_from_the_checkpoint(tmp_path: Path, mode: str,
                                                                                    ranks: tuple[int, int]) -> None:
    """Ranks 0 and 1 (rank 0's replica was on rank 1): the old rank 2 is rank 0 of the new world, names the checkpoint
    and writes the metrics from then on; the step-3 row the lost rank 0 wrote goes."""
    extra, duty = MODES[mode]
    run_dir = tmp_path / "killed"
    done, _ = run_and_kill(run_dir, ranks, EVERY + 1, 0.3, *ARGS, *extra, checkpoint=EVERY, duty=duty)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not marked_processes(str(run_dir))
    assert f"rank {ranks[0]}, {ranks[1]} of 4 lost" in done.stderr, done.stderr[-3000:]
    assert "from the newest complete checkpoint" in done.stderr
    rows = read_metrics(run_dir)  # each step once: the step-3 row logged before the kill went with the rollback
    assert [r["step"] for r in rows] == list(range(STEPS + 1))
    after = rows[EVERY + 1:]
    assert [r.get("elastic/world_size") for r in after] == [2.0] * len(after)
    assert after[0]["elastic/recovery/source"] == 2.0 and after[0]["elastic/recovery/steps_lost"] == 2.0
    first = min(set(range(4)) - set(ranks))  # its launch rank: rank 0 of the new world
    log = (run_dir / "logs" / f"rank{first}.log").read_text()
    assert f"loaded {run_dir / 'checkpoints' / f'step_{EVERY}'} in place, rolled back to step {EVERY}" in log, log[-3000:]
    if 0 in ranks:
        assert f"rank {first} is rank 0 now and writes the run's metrics" in log, log[-3000:]
        assert f"step {STEPS}/{STEPS} |" in done.stdout, done.stdout[-3000:]

    if "rows" not in REFERENCE:
        reference_dir = tmp_path / "resumed"
        REFERENCE["rows"] = run(reference_dir, *[a for a in ARGS if not a.startswith("parallel.world_size=")],
                                "parallel.world_size=2", f"trainer.resume={run_dir / 'checkpoints' / f'step_{EVERY}'}")
        kill_marked(reference_dir)
    assert any(abs(r["actor/pg_loss"]) > 1e-3 for r in REFERENCE["rows"]), "no learning signal: equality is vacuous"
    assert_same_metrics(REFERENCE["rows"], after)


def killed_line(run_dir: Path, rank: int) -> str:
    return next(line for line in (run_dir / "logs" / f"rank{rank}.log").read_text().splitlines() if KILL_TEXT in line)


@pytest.mark.timeout(600)
def test_a_rank_lost_during_a_recovery_stops_the_run_cleanly_with_the_checkpoints_intact(tmp_path: Path) -> None:
    """Rank 2 killed during step 3; launched rank 3 kills itself once the survivors are in their new world, in the
    middle of the recovery: the launcher stops the run within a time limit, naming why; step 2's checkpoint stays
    complete, and no process or /dev/shm entry of the run is left."""
    run_dir = tmp_path / "twice"
    done, seconds = run_and_kill(run_dir, (2,), EVERY, 0.3, *ARGS, *MODES["replicas"][0],
                                 env={KILL_ENV: "elastic/recovery@3"}, limit=400)
    assert done.returncode != 0
    assert seconds < 30, f"the stop took {seconds:.1f} s"
    assert "lost while the survivors were still recovering from the previous loss" in done.stderr, done.stderr[-3000:]
    assert "elastic/recovery of launched rank 3" in killed_line(run_dir, 3)
    assert not marked_processes(str(run_dir))
    ident = re.search(r"run (rlhfdyna-[0-9a-f]+),", killed_line(run_dir, 3)).group(1)
    assert [p.name for p in SHM_DIR.iterdir() if ident in p.name] == [], "the run left /dev/shm entries"
    complete, incomplete = scan(run_dir / "checkpoints")
    assert [step for step, _ in complete] == [EVERY] and incomplete == []


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", ["dp4", "pp2"])
def test_a_rank_killed_inside_a_weight_sync_is_survived_from_the_replicas(grpo4_colocate, tmp_path: Path,
                                                                          layout: str) -> None:
    """Launched rank 2 kills itself as step 3's trained weights go into vLLM (the other ranks are in the sync's
    collectives): the survivors roll back to the step-2 snapshot and finish with exit code 0, logging the same metrics
    as the run whose world never changed. pp2 x dp2 training recovers into dp3 (pp 1 on 3 ranks)."""
    run_dir = tmp_path / "sync"
    args = [a for a in ARGS if not a.startswith(("trainer.total_steps=", "trainer.save_every="))]
    if layout == "pp2":  # 1F1B needs a micro-batch per stage: 4 rows (the sft batch gives 8 per dp rank)
        args = [a.replace("micro_batch_size=16", "micro_batch_size=4") for a in args] + ["parallel.train.pp=2"]
    proc = start(run_dir, *args, "trainer.total_steps=4", "trainer.save_every=0", *MODES["replicas"][0],
                 env={KILL_ENV: "weight_sync/step_3@2"})
    try:
        out, err = proc.communicate(timeout=500)
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_marked(run_dir)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert "weight_sync/step_3 of launched rank 2" in killed_line(run_dir, 2)
    assert not marked_processes(str(run_dir))
    assert "rank 2 of 4 lost" in err
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(5))
    assert rows[3]["elastic/recovery/source"] == 1.0 and rows[3]["elastic/recovery/steps_lost"] == 1.0
    assert [r.get("elastic/world_size") for r in rows[3:]] == [3.0, 3.0]
    assert "training layout dp3xtp1-zero3 on 3 ranks" in (run_dir / "logs" / "rank0.log").read_text()
    assert_same_metrics(grpo4_colocate[:5], rows)  # pp2's 4-row micro-batches: 3.6e-6 from dp4 by step 4
