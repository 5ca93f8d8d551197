"""scripts/bench_reshard.py --quick end to end: every baseline moves the same state correctly, JSON + PNG written."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_reshard.py"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_quick_bench_runs_every_baseline_and_writes_json_and_chart(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "x floor" in done.stdout and "checkpoint_restart" in done.stdout
    report = json.loads((tmp_path / "bench_reshard.json").read_text())
    rows = {(r["transition"], r["method"]): r for r in report["rows"]}
    assert set(rows) >= {("train_to_rollout", m) for m in ("floor", "naive", "redistribute", "vps_cold", "vps")} | {
        ("dp4_to_dp2tp2", m) for m in ("floor", "naive", "redistribute", "vps_cold", "vps", "checkpoint", "checkpoint_restart")}
    assert all(r["correct"] for r in rows.values()), [k for k, r in rows.items() if not r["correct"]]
    assert all(r["seconds"] > 0 and r["x_floor"] >= 1.0 for r in rows.values())
    # dp4 -> tp2 x dp2: a rank needs half the model and holds a quarter; naive receives three quarters of it
    floor, naive = rows[("train_to_rollout", "floor")], rows[("train_to_rollout", "naive")]
    assert 0.3 < floor["bytes_moved"] / naive["bytes_moved"] < 0.7
    for transition in ("train_to_rollout", "dp4_to_dp2tp2", "dp4_to_dp2tp2_searched"):  # exactly the layouts' minimum
        assert rows[(transition, "vps")]["bytes_moved"] == rows[(transition, "floor")]["bytes_moved"], transition
    # the searched rank order (tp outermost) keeps every column-parallel chunk in place: far fewer bytes move
    searched, plain = rows[("dp4_to_dp2tp2_searched", "vps")], rows[("dp4_to_dp2tp2", "vps")]
    assert searched["bytes_moved"] < 0.5 * plain["bytes_moved"]
    assert (tmp_path / "bench_reshard.png").stat().st_size > 10_000
