"""Pre-spawn refusals of a run's devices and GPU memory (checks/gpu.py) through the real CLI, where this machine can
produce the condition: one paragraph each, before any rank starts (the others: tests/unit/gpu/test_gpu_checks.py)."""
from __future__ import annotations

import time

import pytest

from tests.app.app_runs import run_cli


CLI_CASES = [
    (["parallel.device=cuda"], "parallel.device=cuda: the run needs 2 CUDA devices but this machine shows none "
                               "(a CPU build of torch"),
    (["rollout.gpu_memory_utilization=0"], "rollout.gpu_memory_utilization=0.0 is outside (0, 1]"),
    (["rollout.gpu_memory_utilization=1.5"], "rollout.gpu_memory_utilization=1.5 is outside (0, 1]"),
    # the minimum vLLM 0.32 enforces for this model (tests/ranks/gpu/test_kv_minimum.py)
    (["rollout.kv_cache_bytes=98303"], "rollout.kv_cache_bytes=98,303 cannot hold one sequence: one sequence of "
                                       "rollout.max_model_len=64 tokens needs 98,304 bytes"),
]


@pytest.mark.parametrize("args,expected", CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_refused_through_the_cli_before_spawning(args, expected, tmp_path) -> None:
    start = time.monotonic()
    proc = run_cli(*args, tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 30
    assert not list((tmp_path / "run").glob("rank*.log")), "a rank was spawned"
