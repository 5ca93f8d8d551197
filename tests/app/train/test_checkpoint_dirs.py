"""The real app refuses a resume it cannot do before any rank spawns, naming what is missing and the complete
checkpoints there are, and changes nothing on disk (which checkpoint a resume takes: tests/unit/train/)."""
from __future__ import annotations

import subprocess
import sys

from tests.unit.train.test_checkpoint_dirs import make_step


def test_app_refuses_an_incomplete_checkpoint_before_spawning(tmp_path):
    run_dir = tmp_path / "run"
    ckpts = run_dir / "checkpoints"
    make_step(ckpts, 3), make_step(ckpts, 5, complete=False)
    (run_dir / "metrics.jsonl").write_text('{"step": 3}\n')
    cmd = [sys.executable, "-m", "rlhf_dyna", "trainer.total_steps=8", f"trainer.resume={ckpts / 'step_5'}",
           f"hydra.run.dir={run_dir}", "tracking.wandb_mode=disabled"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "incomplete checkpoint (missing COMPLETE)" in proc.stderr and str(ckpts / "step_3") in proc.stderr
    assert "local ranks" not in proc.stdout  # nothing spawned
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 3}\n' and (ckpts / "step_5").is_dir()
    proc = subprocess.run([*cmd[:4], "trainer.total_steps=3", f"trainer.resume={ckpts}", *cmd[5:]],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "leaves nothing to run" in proc.stderr, proc.stderr
