"""End to end: a second terminal joins a running job (`python -m rlhf_dyna elastic.join=RUN_DIR`), and is refused
within seconds, in one paragraph, where RUN_DIR has no running job or its job has finished.

The job (placement=colocate, 3 gloo ranks) writes RUN_DIR/join.json when its ranks start; the second process reads it,
prepares with the job's resolved config and asks on the job's store; at the next step's start the ranks agree on
it and build the new world's groups with it in the background, and rank 0 admits it at that step's end. Both
end with exit code 0, no process is left, the world grows 3 -> 4 at one boundary and the join's metrics are logged
on the first step of the new world; join.json then says the job has finished.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.app.app_runs import AppProcess, read_metrics, run_cli
from tests.app.marked_processes import marked_processes
from tests.app.runtimes.placed_runs import GRPO4, kill_marked

STEPS = 60  # the second process's start-up and preparation took 20-60 s on 2 shared cores
DROPPED = ("trainer.total_steps=", "parallel.world_size=", "trainer.sft_", "algorithm.epochs=", "algorithm.mini_batches=")
ARGS = [a for a in GRPO4 if not a.startswith(DROPPED)]  # no loss is compared here: one optimizer step a batch
ARGS += [f"trainer.total_steps={STEPS}", "parallel.world_size=3", "trainer.sft_warmup_steps=0", "task.eval_every=100",
         "algorithm.epochs=1", "algorithm.mini_batches=1"]


def app(run_dir: Path, output: Path, *args: str) -> AppProcess:
    """The app marked with run_dir (its working directory), its output (stdout and stderr) to `output`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return AppProcess(*args, cwd=run_dir, output=output)


def refused(tmp_path: Path, run_dir: Path) -> tuple[str, float]:
    started = time.monotonic()
    proc = run_cli(f"elastic.join={run_dir}", tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return proc.stderr, time.monotonic() - started


@pytest.mark.timeout(900)
def test_a_second_terminal_joins_a_running_job_and_late_or_wrong_requests_are_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "job"
    message, seconds = refused(tmp_path / "none", tmp_path)  # a directory without a job
    assert f"elastic.join={tmp_path}: this directory has no running job to join" in message and seconds < 30

    job = app(run_dir, tmp_path / "job.out", *ARGS, f"hydra.run.dir={run_dir}")
    joiner = None
    try:
        deadline = time.monotonic() + 600
        while not (run_dir / "join.json").exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not json.loads((run_dir / "join.json").read_text())["finished"]
        joiner = app(run_dir, tmp_path / "joiner.out", f"elastic.join={run_dir}",
                     f"hydra.run.dir={tmp_path / 'joiner'}")
        job.wait(timeout=max(1.0, deadline - time.monotonic()))
        joiner.wait(timeout=120)
    finally:
        for proc in (job, joiner):
            if proc is not None and proc.poll() is None:
                proc.kill()
        kill_marked(run_dir)
    job_out, join_out = (tmp_path / "job.out").read_text(), (tmp_path / "joiner.out").read_text()
    assert job.returncode == 0, job_out[-3000:]
    assert joiner.returncode == 0, join_out[-3000:]
    assert "request0 joins after step" in join_out and "trained with it to the end" in join_out
    assert not marked_processes(str(run_dir))

    rows = read_metrics(run_dir)
    sizes = [r["elastic/world_size"] for r in rows[1:]]
    joined_after = sizes.index(4.0)  # the step after which the request was admitted
    assert 1 <= joined_after < STEPS and sizes == [3.0] * joined_after + [4.0] * (STEPS - joined_after), sizes
    change = rows[joined_after + 1]
    assert change["elastic/join/bytes_moved"] > 0 and change["elastic/join/ready_wait_seconds"] < 1.0
    assert change["elastic/join/background"] == 1.0  # agreed on at the start of the step before: built during it
    assert f"elastic/join/+1@{joined_after}: 1 rank joins (3 -> 4 ranks)" in (run_dir / "logs" / "rank0.log").read_text()
    assert json.loads((run_dir / "join.json").read_text())["finished"]

    message, seconds = refused(tmp_path / "late", run_dir)  # the job has finished
    assert f"elastic.join={run_dir}: the job in this directory has finished" in message and seconds < 30
