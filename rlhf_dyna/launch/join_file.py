"""`RUN_DIR/join.json`: what a process started with `python -m rlhf_dyna elastic.join=RUN_DIR` needs to join a running
job (docs/elastic.md): the job's store address, its run ident, its resolved config, and whether it is still running.

The launcher (launch/spawn.py) writes it when the ranks start, for a job that admits joins (elastic.accept_joins), and
marks it finished when they stop; `running_job` reads it and refuses, in one paragraph, a directory without a
running job."""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .host import LaunchError

JOIN_FILE = "join.json"


@dataclass(frozen=True)
class RunningJob:
    host: str
    port: int
    run_ident: str
    launcher_pid: int
    world_size: int  # at launch
    config: str  # the resolved config the joiner runs with
    finished: float | None = None  # time.time() when the launcher stopped the ranks


def write_join_file(run_dir: Path, job: RunningJob) -> None:
    path = Path(run_dir) / JOIN_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(job), indent=2) + "\n")
    tmp.replace(path)  # a joiner never reads half a file


def mark_finished(run_dir: Path) -> None:
    path = Path(run_dir) / JOIN_FILE
    if path.exists():
        write_join_file(run_dir, RunningJob(**{**json.loads(path.read_text()), "finished": time.time()}))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_job(run_dir: str | Path) -> RunningJob:
    """The job running in `run_dir`; LaunchError naming what is wrong when there is none to join."""
    path = Path(run_dir) / JOIN_FILE
    if not Path(run_dir).is_dir():
        raise LaunchError(f"elastic.join={run_dir}: no such directory. Give the run directory of a job started with "
                          "python -m rlhf_dyna (placement=colocate) that is still running.")
    if not path.exists():
        raise LaunchError(
            f"elastic.join={run_dir}: this directory has no running job to join (no {JOIN_FILE}: the launcher writes "
            "it while a job that admits joins runs: placement=colocate, rollout.tp=1, started with python -m "
            "rlhf_dyna, not torchrun, elastic.accept_joins not false). Give the run directory of such a job while it "
            "runs.")
    job = RunningJob(**json.loads(path.read_text()))
    if job.finished is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.finished))
        raise LaunchError(f"elastic.join={run_dir}: the job in this directory has finished (at {when}); there is no "
                          "world left to join. Start a new job, or join one that is still running.")
    if not _alive(job.launcher_pid):
        raise LaunchError(f"elastic.join={run_dir}: the job in this directory is not running (its launcher, pid "
                          f"{job.launcher_pid}, is gone without marking {JOIN_FILE} finished: it was killed). Start "
                          "a new job, or join one that is still running.")
    return job
