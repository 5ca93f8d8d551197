"""End to end under torchrun (`--standalone`, 3 gloo ranks, the agent's store): processes started by hand with
`python -m rlhf_dyna elastic.join=RUN_DIR` ask to join (launch/torchrun_join.py, docs/elastic/join_requests.md).

One torchrun job, two joining processes, started together after its step 2 (so at least 3 steps run on 3 ranks), and
the same job without them beside it. The one that asks first kills itself (a real SIGKILL, RLHF_DYNA_KILL_AT) once
prepared, before its admission: no launcher of ours watches it, so rank 0 finds its announced pid gone at the next
step's agreement, drops it with a line naming it, and trains on. The other is admitted at a step boundary. torchrun
and the other joiner end with exit code 0, no process is left, the world is 3 ranks before the join and 4 after it,
and the steps before the join and the first two after it log the same losses, grad norms, rewards and eval as the
torchrun job without joiners (relative 1e-5: the same global batch; 8 steps after the join a grad norm differed by
2e-5, dp 4 summing in another order than dp 3). Rank 0 marks join.json finished (naming torchrun's agent as the
launcher), no /dev/shm entry of the run is left, and a late joiner is refused within seconds.
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
from rlhf_dyna.launch.shm import SHM_DIR
from tests.app.app_runs import AppProcess, read_metrics, run_cli
from tests.app.elastic.live_runs import wait_for
from tests.app.marked_processes import marked_processes
from tests.app.runtimes.placed_runs import GRPO4, assert_same_metrics, kill_marked

STEPS = 30  # the joiners start after step 2; a preparation took 2-15 s (20-60 s under load), a step 0.6-2.5 s
DROPPED = ("trainer.total_steps=", "parallel.world_size=", "task.eval_every=", "trainer.sft_")
ARGS = [a for a in GRPO4 if not a.startswith(DROPPED)] + [
    f"trainer.total_steps={STEPS}", "parallel.world_size=3", "task.eval_every=10", "trainer.sft_warmup_steps=10",
    "trainer.sft_batch_size=12",
    "elastic.accept_joins=true"]
KILLED = 3  # the first elastic.join process: launch index world_size + 0, its kill point's rank


def torchrun(run_dir: Path) -> subprocess.Popen:
    """torchrun --standalone with 3 local ranks of the app in run_dir, which marks its processes (their cwd)."""
    run_dir.mkdir(parents=True)
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                             "--max-restarts", "0", "-m", "rlhf_dyna", *ARGS, f"hydra.run.dir={run_dir}"],
                            cwd=run_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def logged(run_dir: Path) -> int:
    """Rows in the run's metrics.jsonl so far (step 0 included)."""
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def joiner(run_dir: Path, output: Path, **env: str) -> AppProcess:
    return AppProcess(f"elastic.join={run_dir}", f"hydra.run.dir={output.with_suffix('')}", cwd=run_dir, output=output,
                      env={**os.environ, **env})


@pytest.mark.timeout(600)
def test_processes_started_by_hand_join_a_torchrun_job_and_one_killed_before_admission_is_dropped(tmp_path: Path):
    run_dir, joiners = tmp_path / "job", []
    fixed, job = torchrun(tmp_path / "fixed"), torchrun(run_dir)  # at once: the start-ups overlap
    try:
        deadline = time.monotonic() + 300
        wait_for(lambda: logged(run_dir) > 2 or job.poll() is not None, "step 2", deadline)  # 3 steps on 3 ranks
        # both at once; the kill point names request0's launch index, so whichever asked first dies
        joiners = [joiner(run_dir, tmp_path / f"joiner{i}.out", **{KILL_ENV: f"join/wait@{KILLED}"}) for i in (0, 1)]
        out = job.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
        for proc in joiners:
            proc.wait(timeout=60)
        fixed_out = fixed.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
    finally:
        for proc in (fixed, job, *joiners):
            if proc.poll() is None:
                proc.kill()
        kill_marked(run_dir)
        kill_marked(tmp_path / "fixed")
    assert fixed.returncode == 0, fixed_out[-3000:]
    expected = read_metrics(tmp_path / "fixed")
    assert any(r.get("reward/mean") for r in expected), "nothing to compare: every reward 0"
    outputs = [(tmp_path / f"joiner{i}.out").read_text() for i in (0, 1)]
    killed_at = [i for i in (0, 1) if KILL_TEXT in outputs[i]]
    assert len(killed_at) == 1, outputs
    killed, joined = outputs[killed_at[0]], outputs[1 - killed_at[0]]
    assert joiners[killed_at[0]].returncode == -9, killed[-3000:]
    assert job.returncode == 0, out[-3000:] + joined[-2000:]
    assert joiners[1 - killed_at[0]].returncode == 0, joined[-3000:]
    assert "request1 joins after step" in joined and "trained with it to the end" in joined, joined[-3000:]
    assert not marked_processes(str(run_dir)) and not marked_processes(str(tmp_path / "fixed"))

    log = (run_dir / "logs" / "rank0.log").read_text()
    dropped = "died before the world admitted it; the run goes on without it"
    assert "request0 (pid " in log and dropped in log, log[-3000:]
    rows = read_metrics(run_dir)
    sizes = [r["elastic/world_size"] for r in rows[1:]]
    after = sizes.index(4.0)  # the step after which request1 was admitted
    assert 3 <= after < STEPS and sizes == [3.0] * after + [4.0] * (STEPS - after), sizes
    assert rows[after + 1]["elastic/join/bytes_moved"] > 0 and rows[after + 1]["elastic/join/background"] == 1.0
    # the steps before the join, and two in the new world (later ones drift past 1e-5: dp 4 sums in another order)
    assert_same_metrics(expected[:after + 3], rows[:after + 3])

    finished = json.loads((run_dir / "join.json").read_text())
    assert finished["finished"] and finished["launcher_pid"] == job.pid and finished["world_size"] == 3
    assert [p.name for p in SHM_DIR.iterdir() if finished["run_ident"] in p.name] == []  # the joiner's too
    started = time.monotonic()
    late = run_cli(f"elastic.join={run_dir}", tmp_path=tmp_path / "late")
    assert late.returncode == 2 and f"elastic.join={run_dir}: the job in this directory has finished" in late.stderr
    assert time.monotonic() - started < 30
