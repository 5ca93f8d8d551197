"""Output routing inside a rank that no launcher of ours supervises (torchrun), in real processes."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).parents[3]
RANK_BODY = """
import os, sys, warnings
from rlhf_dyna.errors import ConfigError
from rlhf_dyna.launch import record_failure, route_rank_output
route_rank_output(sys.argv[1], int(sys.argv[2]), sys.argv[3])
print("rlhf_dyna: building the actor...")
print("step 1/2 | reward/mean 0.5")
print("a third party's notice")
warnings.warn("a FutureWarning of someone else's", FutureWarning)
os.write(1, b"[rank0]: a C++ warning\\n")
os.write(2, b"Loading safetensors checkpoint shards: 100%\\n")
try:
    raise ConfigError("task.reward 'x:y' failed on purpose")
except ConfigError as err:
    record_failure(err, int(sys.argv[2]))
"""
NOISE = ("third party", "FutureWarning", "C++ warning", "safetensors")


def run_rank(tmp_path: Path, rank: int, mode: str) -> tuple[str, str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-c", RANK_BODY, str(tmp_path), str(rank), mode], capture_output=True,
                          text=True, timeout=60, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr, (tmp_path / "logs" / f"rank{rank}.log").read_text()


@pytest.mark.timeout(120)
def test_rank0_shows_its_own_lines_and_logs_everything(tmp_path):
    console, log = run_rank(tmp_path, 0, "progress")
    assert console.splitlines() == [f"rlhf_dyna: output in {tmp_path}, rank logs in {tmp_path / 'logs'}",
                                    "rlhf_dyna: building the actor...", "step 1/2 | reward/mean 0.5",
                                    "rlhf_dyna: error: task.reward 'x:y' failed on purpose"]
    for noise in NOISE:
        assert noise in log
    assert "rlhf_dyna: building the actor..." in log


@pytest.mark.timeout(120)
def test_other_ranks_show_nothing_and_verbose_routes_nothing(tmp_path):
    console, log = run_rank(tmp_path, 1, "plain")
    assert console == "" and all(noise in log for noise in NOISE)
    proc = subprocess.run([sys.executable, "-c", RANK_BODY, str(tmp_path / "v"), "0", "verbose"], capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)})
    assert all(noise in proc.stdout + proc.stderr for noise in NOISE)
    assert not (tmp_path / "v" / "logs").exists()
