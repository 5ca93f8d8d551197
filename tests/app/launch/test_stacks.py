"""`kill -USR1` of any process of a running job (the launcher, a rank) writes every thread's Python stack to
`logs/<launcher|rankR>.stacks` and the run goes on (launch/output.stacks_on_signal): a hung run's state without a
debugger, which the tests' kill_marked collects before it kills what a timeout left."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rlhf_dyna.launch.output import STACKS_SIGNAL, stacks_file
from tests.app.elastic.live_runs import start, wait_for
from tests.app.elastic.test_replica_recovery import logged
from tests.app.marked_processes import marked_processes
from tests.app.runtimes.placed_runs import GRPO4, kill_marked

ARGS = [a for a in GRPO4 if not a.startswith(("parallel.world_size=", "trainer.total_steps="))] + [
    "parallel.world_size=2", "trainer.total_steps=3"]


@pytest.mark.timeout(600)
def test_every_process_of_a_job_writes_its_stacks_on_sigusr1_and_the_run_goes_on(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start(run_dir, *ARGS)
    try:
        wait_for(lambda: logged(run_dir, 1), "step 1", time.monotonic() + 400)
        pids = marked_processes(str(run_dir))
        assert len(pids) == 3, pids  # the launcher and two ranks
        for pid in pids:
            os.kill(pid, STACKS_SIGNAL)
        out, err = proc.communicate(timeout=300)
    finally:
        kill_marked(run_dir)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    launcher = stacks_file(run_dir, "launcher").read_text()
    assert "in spawn_ranks" in launcher and "Current thread" in launcher, launcher
    for rank in (0, 1):
        stacks = stacks_file(run_dir, f"rank{rank}").read_text()
        assert "Current thread 0x" in stacks and "rlhf_dyna/orchestrator/loop.py" in stacks, stacks
