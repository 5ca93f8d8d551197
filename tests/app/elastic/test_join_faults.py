"""End to end: a joining process killed (a real `kill -9`, RLHF_DYNA_KILL_AT: elastic/faults.py) before the world admits
it, or inside its join (after admission, while the state moves to it; placement=colocate, 3 gloo ranks + 1).

Before admission (while it prepares, or while it waits for its boundary, `elastic.events=[join@2]`): the launcher does
not stop the run; the world drops the joiner at its boundary with a line naming it and trains on with 3 ranks to the
end (exit code 0, each step once, no process left). Inside its join, without replicas: the run stops within seconds,
leaving no process and no /dev/shm entry of the run, its last checkpoint complete. Inside its join with
elastic.replicas=1 (an `elastic.join=RUN_DIR` process, which the launcher watches by its pid): the lost joiner is a
lost rank of the 4-rank world, and the survivors go back to the 3-rank world of the snapshot before the join, each
from its own shards, and finish (exit code 0, each step once)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from rlhf_dyna.elastic.faults import KILL_ENV, KILL_TEXT
from rlhf_dyna.launch.shm import SHM_DIR
from rlhf_dyna.orchestrator.checkpoint_dirs import scan
from tests.app.app_runs import AppProcess, read_metrics
from tests.app.elastic.live_runs import run_with_kill_point, start, wait_for
from tests.app.elastic.test_join_request import ARGS as ARGS3
from tests.app.marked_processes import marked_processes
from tests.app.runtimes.placed_runs import kill_marked

STEPS = 4
ARGS = [a for a in ARGS3 if not a.startswith("trainer.total_steps=")] + [f"trainer.total_steps={STEPS}"]
JOINER = 3  # the joiner's launch index (world_size + 0): its kill point's rank


@pytest.mark.timeout(600)
@pytest.mark.parametrize("where", ["prepare", "wait"])
def test_a_joiner_killed_before_its_admission_is_dropped_and_the_world_trains_on(tmp_path: Path, where: str) -> None:
    run_dir = tmp_path / where
    code, out, err, _ = run_with_kill_point(run_dir, *ARGS, "elastic.events=[join@2]",
                                         kill_at=f"join/{where}@{JOINER}", limit=400)
    assert code == 0, out[-3000:] + err[-3000:]
    assert not marked_processes(str(run_dir))
    assert f"joiner0 (process {JOINER}) exited with code 137 before the world admitted it; the run goes on without " \
           "it" in err, err[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS + 1))
    assert [r["elastic/world_size"] for r in rows[1:]] == [3.0] * STEPS
    assert not any(k.startswith("elastic/join/") for r in rows for k in r)
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "elastic/join/+1@2: joiner0 died before the world admitted it; the world goes on with 3 ranks" in log, \
        log[-3000:]


@pytest.mark.timeout(600)
def test_a_joiner_killed_inside_its_join_stops_a_run_without_replicas_cleanly(tmp_path: Path) -> None:
    run_dir = tmp_path / "move"
    code, out, err, seconds = run_with_kill_point(run_dir, *ARGS, "elastic.events=[join@2]", "trainer.save_every=1",
                                                  "trainer.keep_checkpoints=0", kill_at=f"join/move@{JOINER}",
                                                  limit=400)
    assert code != 0, out[-3000:] + err[-3000:]
    assert seconds < 30, f"the stop took {seconds:.1f} s"
    # the cause shown: the joiner (no record of its own) or a peer whose error was recorded before its exit was seen
    assert "of 4 failed" in err and "stopped the other ranks" in err, err[-3000:]
    assert not marked_processes(str(run_dir))
    ident = json.loads((run_dir / "join.json").read_text())["run_ident"]
    assert [p.name for p in SHM_DIR.iterdir() if ident in p.name] == []
    complete, _ = scan(run_dir / "checkpoints")
    assert [step for step, _ in complete][-1:] == [2], complete  # the join's boundary: after step 2's checkpoint


@pytest.mark.timeout(600)
def test_a_requested_joiner_killed_inside_its_join_is_survived_from_the_snapshot(tmp_path: Path) -> None:
    steps, run_dir = 30, tmp_path / "job"
    args = [a for a in ARGS if not a.startswith("trainer.total_steps=")]
    job = start(run_dir, *args, f"trainer.total_steps={steps}", "elastic.replicas=1", "elastic.snapshot_every=1")
    joiner, output = None, tmp_path / "joiner.out"
    try:
        deadline = time.monotonic() + 400
        wait_for(lambda: (run_dir / "join.json").exists() or job.poll() is not None, "join.json", deadline)
        joiner = AppProcess(f"elastic.join={run_dir}", f"hydra.run.dir={tmp_path / 'joiner'}", cwd=run_dir,
                            output=output, env={**os.environ, KILL_ENV: f"join/move@{JOINER}"})
        out, err = job.communicate(timeout=max(1.0, deadline - time.monotonic()))
        joiner.wait(timeout=60)
    finally:
        for proc in (job, joiner):
            if proc is not None and proc.poll() is None:
                proc.kill()
        kill_marked(run_dir)
    joined = output.read_text()
    assert KILL_TEXT in joined and joiner.returncode == -9, joined[-3000:]
    assert job.returncode == 0, out[-3000:] + err[-3000:] + joined[-2000:]
    assert not marked_processes(str(run_dir))
    assert "rank 3 of 4 lost (process request0)" in err, err[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(steps + 1))  # each step once: the join's step redone on 3 ranks
    assert {r["elastic/world_size"] for r in rows[1:]} == {3.0}
    recovered = [r for r in rows if "elastic/recovery/seconds" in r]
    assert len(recovered) == 1 and recovered[0]["elastic/recovery/source"] == 1.0
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "it joined after the newest snapshot: the 3-rank world of that snapshot again" in log, log[-3000:]
