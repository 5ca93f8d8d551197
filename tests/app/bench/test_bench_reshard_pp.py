"""scripts/bench_reshard_pp.py --quick end to end: dp4 -> pp2 x dp2 (dense) and dp4 -> ep2 x dp2 (MoE) with AdamW by
VPS move exactly the bytes an independent count (torch's DTensor placements) gives, land the values a DCP load after
a restart gives, and are at least 10x faster than DCP with restart."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "bench_reshard_pp.py"


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.timeout(600)
def test_quick_pp_and_ep_bench_move_the_independent_count_and_beat_dcp_restart(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "bench_reshard_pp.json").read_text())["rows"]
    assert [r["transition"] for r in rows] == ["dp4_to_pp2dp2", "dp4_to_ep2dp2"]
    for row in rows:
        assert row["correct"], row
        assert row["vps_bytes_moved"] == row["independent_bytes"] > 0, row
        assert row["speedup"] >= 10, row
    assert not list(tmp_path.glob("ckpt_pp_*")), "the DCP checkpoint is left behind"
