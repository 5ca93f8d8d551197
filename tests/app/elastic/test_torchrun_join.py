"""End to end under torchrun (`--standalone`, 3 gloo ranks, the agent's store): processes started by hand with
`python -m rlhf_dyna elastic.join=RUN_DIR` ask to join (launch/torchrun_join.py, docs/elastic.md).

One torchrun job, two joining processes. The first kills itself (a real SIGKILL, RLHF_DYNA_KILL_AT) once prepared,
before its admission: no launcher of ours watches it, so rank 0 finds its announced pid gone at the next step's
agreement, drops it with a line naming it, and trains on. The second is admitted at a step boundary. torchrun and the
second joiner end with exit code 0, no process is left, the world is 3 ranks before the join and 4 after it, and the
steps before the join and the first two after it log the same losses, grad norms, rewards and eval as the torchrun job
without joiners (relative 1e-5: the same global batch; 8 steps after the join a grad norm differed by 2e-5, dp 4
summing in another order than dp 3). Rank 0 marks join.json finished, and a late joiner is refused within seconds.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlhf_dyna.elastic.faults import KILL_ENV, KILL_TEXT
from tests.app.app_runs import AppProcess, read_metrics, run_cli
from tests.app.elastic.live_runs import wait_for
from tests.app.marked_processes import marked_processes
from tests.app.runtimes.placed_runs import GRPO4, assert_same_metrics, kill_marked

STEPS = 30  # the joiners start when join.json appears; a preparation took 7-15 s, a step 0.4 s on 2 shared cores
DROPPED = ("trainer.total_steps=", "parallel.world_size=", "task.eval_every=", "trainer.sft_")
ARGS = [a for a in GRPO4 if not a.startswith(DROPPED)] + [
    f"trainer.total_steps={STEPS}", "parallel.world_size=3", "task.eval_every=10", "trainer.sft_warmup_steps=10", "trainer.sft_batch_size=12",
    "elastic.accept_joins=true"]
KILLED = 3  # the first elastic.join process: launch index world_size + 0, its kill point's rank


def torchrun(run_dir: Path) -> subprocess.Popen:
    """torchrun --standalone with 3 local ranks of the app in run_dir, which marks its processes (their cwd)."""
    run_dir.mkdir(parents=True)
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                             "--max-restarts", "0", "-m", "rlhf_dyna", *ARGS, f"hydra.run.dir={run_dir}"],
                            cwd=run_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def joiner(run_dir: Path, output: Path, **env: str) -> AppProcess:
    return AppProcess(f"elastic.join={run_dir}", f"hydra.run.dir={output.with_suffix('')}", cwd=run_dir, output=output,
                      env={**os.environ, **env})


@pytest.mark.timeout(600)
def test_processes_started_by_hand_join_a_torchrun_job_and_one_killed_before_admission_is_dropped(tmp_path: Path):
    fixed = torchrun(tmp_path / "fixed")
    out = fixed.communicate(timeout=300)[0]
    assert fixed.returncode == 0, out[-3000:]
    expected = read_metrics(tmp_path / "fixed")
    assert any(r.get("reward/mean") for r in expected), "nothing to compare: every reward 0"

    run_dir, joiners = tmp_path / "job", []
    job = torchrun(run_dir)
    try:
        deadline = time.monotonic() + 300
        wait_for(lambda: (run_dir / "join.json").exists() or job.poll() is not None, "join.json", deadline)
        joiners.append(joiner(run_dir, tmp_path / "killed.out", **{KILL_ENV: f"join/wait@{KILLED}"}))
        joiners[0].wait(timeout=120)
        joiners.append(joiner(run_dir, tmp_path / "joiner.out"))
        out = job.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
        joiners[1].wait(timeout=60)
    finally:
        for proc in (job, *joiners):
            if proc.poll() is None:
                proc.kill()
        kill_marked(run_dir)
    killed, joined = (tmp_path / "killed.out").read_text(), (tmp_path / "joiner.out").read_text()
    assert KILL_TEXT in killed and joiners[0].returncode == -9, killed[-3000:]
    assert job.returncode == 0, out[-3000:] + joined[-2000:]
    assert joiners[1].returncode == 0, joined[-3000:]
    assert "request1 joins after step" in joined and "trained with it to the end" in joined, joined[-3000:]
    assert not marked_processes(str(run_dir))

    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "request0 (pid " in log and "died before the world admitted it; the run goes on without it" in log, log[-3000:]
    rows = read_metrics(run_dir)
    sizes = [r["elastic/world_size"] for r in rows[1:]]
    after = sizes.index(4.0)  # the step after which request1 was admitted
    assert 1 <= after < STEPS and sizes == [3.0] * after + [4.0] * (STEPS - after), sizes
    assert rows[after + 1]["elastic/join/bytes_moved"] > 0 and rows[after + 1]["elastic/join/background"] == 1.0
    # the steps before the join, and two in the new world (later ones drift past 1e-5: dp 4 sums in another order)
    assert_same_metrics(expected[:after + 3], rows[:after + 3])

    finished = json.loads((run_dir / "join.json").read_text())
    assert finished["finished"] and finished["port"] == int(finished["port"]) and finished["world_size"] == 3
    started = time.monotonic()
    late = run_cli(f"elastic.join={run_dir}", tmp_path=tmp_path / "late")
    assert late.returncode == 2 and f"elastic.join={run_dir}: the job in this directory has finished" in late.stderr
    assert time.monotonic() - started < 30
