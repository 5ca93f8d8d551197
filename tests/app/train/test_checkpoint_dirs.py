"""The real app refuses a resume it cannot do before any rank spawns, naming what is missing and the complete
checkpoints there are, and changes nothing on disk (which checkpoint a resume takes: tests/unit/train/)."""
from __future__ import annotations

from tests.app.app_runs import run_app
from tests.unit.train.test_checkpoint_dirs import make_step


def test_app_refuses_an_incomplete_checkpoint_before_spawning(tmp_path):
    run_dir = tmp_path / "run"
    ckpts = run_dir / "checkpoints"
    make_step(ckpts, 3), make_step(ckpts, 5, complete=False)
    (run_dir / "metrics.jsonl").write_text('{"step": 3}\n')
    cmd = ["trainer.total_steps=8", f"trainer.resume={ckpts / 'step_5'}", f"hydra.run.dir={run_dir}",
           "tracking.wandb_mode=disabled"]
    proc = run_app(*cmd, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "incomplete checkpoint (missing COMPLETE)" in proc.stderr and str(ckpts / "step_3") in proc.stderr
    assert "local ranks" not in proc.stdout  # nothing spawned
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 3}\n' and (ckpts / "step_5").is_dir()
    proc = run_app("trainer.total_steps=3", f"trainer.resume={ckpts}", *cmd[2:], timeout=60)
    assert proc.returncode == 2 and "leaves nothing to run" in proc.stderr, proc.stderr
