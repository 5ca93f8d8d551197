"""Runs of the app that a live elastic test signals from outside: started with every process marked, one rank
signalled once the run is where the test wants it, and nothing of the run left afterwards."""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from rlhf_dyna.elastic.faults import KILL_ENV, KILL_TEXT
from tests.app.elastic.rank_logs import announced_pid
from tests.app.app_runs import AppProcess
from tests.app.runtimes.placed_runs import kill_marked, run


def start(run_dir: Path, *args: str, env: dict | None = None) -> AppProcess:
    """The app running in run_dir, which marks its processes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return AppProcess(*args, f"hydra.run.dir={run_dir}", env=dict(os.environ, **(env or {})), cwd=run_dir)


def wait_for(check: Callable[[], bool], what: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise TimeoutError(what)


def signal_rank(run_dir: Path, args: list[str], rank: int, marker: str, ready: Callable[[float], None], sig: int,
                limit: float = 600) -> subprocess.CompletedProcess:
    """The app with `args`; `sig` sent to `rank` (its pid from the log line naming `marker`) once `ready(deadline)`
    returns; the finished run, its marked processes killed whatever happened."""
    proc = start(run_dir, *args)
    try:
        deadline = time.monotonic() + limit
        pid = announced_pid(run_dir, rank, deadline, marker)
        ready(deadline)
        os.kill(pid, sig)
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_marked(run_dir)


def run_with_kill_point(run_dir: Path, *args: str, kill_at: str, limit: float = 500) -> tuple[int, str, str, float]:
    """The app run to its end with launched rank R killing itself at point P (`kill_at` = "P@R",
    elastic/faults.kill_point): (exit code, stdout, stderr, seconds from the kill to the launcher's exit)."""
    rank = kill_at.rsplit("@", 1)[1]
    proc, log = start(run_dir, *args, env={KILL_ENV: kill_at}), run_dir / "logs" / f"rank{rank}.log"
    try:
        deadline = time.monotonic() + limit
        wait_for(lambda: (log.exists() and KILL_TEXT in log.read_text()) or proc.poll() is not None, "the kill",
                 deadline)
        killed = time.monotonic()
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        return proc.returncode, out, err, time.monotonic() - killed
    finally:
        kill_marked(run_dir)  # a hung run: every process's stacks first, the launcher's too
        if proc.poll() is None:
            proc.kill()


def resumed_reference(tmp_path: Path, run_dir: Path, args: list[str], world_size: int, step: int,
                      *extra: str) -> list[dict]:
    """The reference of a recovery: `args` on `world_size` ranks resumed by trainer.resume from run_dir's checkpoint
    of `step` (in tmp_path/resumed); its metrics rows, nothing of it left running."""
    reference_dir = tmp_path / "resumed"
    try:
        return run(reference_dir, *[a for a in args if not a.startswith("parallel.world_size=")],
                   f"parallel.world_size={world_size}", *extra,
                   f"trainer.resume={run_dir / 'checkpoints' / f'step_{step}'}")
    finally:
        kill_marked(reference_dir)


def with_and_without(tmp_path: Path, args: list[str], *changes: str) -> tuple[list[dict], list[dict]]:
    """`args` run as is (tmp_path/fixed) and with `changes` (tmp_path/changed): both runs' metrics rows, nothing of
    either left running."""
    try:
        return run(tmp_path / "fixed", *args), run(tmp_path / "changed", *args, *changes)
    finally:
        kill_marked(tmp_path / "fixed")
        kill_marked(tmp_path / "changed")
