"""The pure part of elastic/ in a fresh interpreter: importing it loads no torch."""
from __future__ import annotations

import subprocess
import sys


def test_elastic_pure_part_imports_no_torch():
    code = ("import sys, rlhf_dyna.elastic.placement, rlhf_dyna.elastic.policies, rlhf_dyna.elastic.simulate; "
            "assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
