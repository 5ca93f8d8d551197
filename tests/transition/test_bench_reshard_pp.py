"""scripts/bench_reshard_pp.py --quick end to end: dp4 -> pp2 x dp2 with AdamW by VPS moves exactly the bytes an
independent count (torch's DTensor placements) gives, lands the values a DCP load after a restart gives, and is at
least 10x faster than DCP with restart."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_reshard_pp.py"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_pp_bench_moves_the_independent_count_and_beats_dcp_restart(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads((tmp_path / "bench_reshard_pp.json").read_text())["rows"][0]
    assert row["transition"] == "dp4_to_pp2dp2" and row["correct"]
    assert row["vps_bytes_moved"] == row["independent_bytes"] > 0
    assert row["speedup"] >= 10, row
    assert not list(tmp_path.glob("ckpt_pp_*")), "the DCP checkpoint is left behind"
