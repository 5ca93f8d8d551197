"""scripts/gpu_check.py on a machine without CUDA: one line that says nothing was checked, a JSON summary that says
the same, exit 0 (the suite never depends on a GPU)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[3]


def test_gpu_check_says_it_skipped_without_cuda(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--json", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("gpu_check: skipped: no CUDA device visible (torch 2.13.0+cpu"), proc.stdout
    assert lines[0].endswith("nothing of the GPU path was checked")
    report = json.loads(out.read_text())
    assert report == json.loads(proc.stdout[proc.stdout.index("{"):])  # the printed summary is the written one
    assert (report["cuda"], report["passed"], report["failed"], report["skipped"], report["checks"]) == (False, 0, 0, 0, [])
    assert "nothing of the GPU path was checked" in report["note"]
