"""Runs of the app that a live elastic test signals from outside: started with every process marked, one rank
signalled once the run is where the test wants it, and nothing of the run left afterwards."""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.app.elastic.rank_logs import announced_pid
from tests.app.app_runs import AppProcess
from tests.app.runtimes.placed_runs import kill_marked


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
