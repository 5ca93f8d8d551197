"""End to end: scripted membership changes in a run resumed from a checkpoint (trainer.resume with elastic.events).
An event's step is the run's global step, and the resumed run starts with parallel.world_size ranks.

The session's 4-rank run (tests/app/conftest.py: grpo4_colocate_run, a checkpoint every 2 steps) resumed from its step-2
checkpoint on 4 ranks with `leave:3@3,join@4` runs steps 3-6, 4 -> 3 ranks after step 3 and 3 -> 4 after step 4 (the
joiner started by the resumed run's launcher), ends with exit code 0 and no process left, and logs the same losses, grad norms, rewards, lengths and eval (relative 1e-5) as that run, which logs what a
resume without events logs (tests/app/runs/test_checkpoint_resume.py): nothing changes but the world. An event at or
before the resumed step is refused before spawn, naming it and the world it would have left.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.app.app_runs import run_app
from tests.app.marked_processes import marked_processes
from tests.app.runtimes.placed_runs import GRPO4, assert_same_metrics, kill_marked, run

STEPS = 6
ARGS = [a for a in GRPO4 if not a.startswith("trainer.total_steps=")] + [f"trainer.total_steps={STEPS}"]


@pytest.mark.timeout(900)
def test_a_resumed_run_changes_its_world_after_its_global_steps_and_nothing_else(grpo4_colocate_run,
                                                                                      tmp_path: Path) -> None:
    fixed_dir, fixed = grpo4_colocate_run
    run_dir = tmp_path / "resumed"
    try:
        rows = run(run_dir, *ARGS, f"trainer.resume={fixed_dir / 'checkpoints' / 'step_2'}", "elastic.events=[leave:3@3,join@4]")
    finally:
        kill_marked(run_dir)
    assert not marked_processes(str(run_dir))
    assert [r["step"] for r in rows] == [3, 4, 5, 6]
    assert [r["elastic/world_size"] for r in rows] == [4.0, 3.0, 4.0, 4.0]
    assert rows[1]["elastic/leave/bytes_moved"] > 0 and rows[1]["elastic/leave/background"] == 1.0
    assert rows[2]["elastic/join/bytes_moved"] > 0 and rows[2]["elastic/join/background"] == 1.0
    assert any(abs(r["actor/pg_loss"]) > 1e-3 for r in rows), "no learning signal: equality would be vacuous"
    assert_same_metrics(fixed[3:STEPS + 1], rows)
    assert "rank 3 left the job after sending its state" in (run_dir / "logs" / "rank3.log").read_text()


def test_an_event_at_or_before_the_resumed_step_is_refused_before_spawn(grpo4_colocate_run, tmp_path: Path) -> None:
    checkpoint = grpo4_colocate_run[0] / "checkpoints" / "step_4"
    proc = run_app(*ARGS, f"trainer.resume={checkpoint}", "elastic.events=[leave:3@2,join@5]",
                   f"hydra.run.dir={tmp_path}", timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (f"the run resumes after step 4 (the checkpoint {checkpoint}, saved on 4 ranks) with parallel.world_size=4 "
            "ranks, and an event's step is the run's global step, so leave:3@2 (at or before step 4) would never "
            "happen. Drop it (elastic.events=[join@5]), and to resume in the world it left, set parallel.world_size=3"
            ) in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not list(tmp_path.glob("logs/rank*.log"))
