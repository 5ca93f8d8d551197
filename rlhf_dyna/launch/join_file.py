"""`RUN_DIR/join.json`: what a process started with `python -m rlhf_dyna elastic.join=RUN_DIR` needs to join a running
job (docs/elastic/join_requests.md): the job's store address, its run ident, its resolved config, the host it runs on, and whether it
is still running.

For a job that admits joins (elastic.accept_joins) the launcher (launch/spawn.py) writes it when the ranks start and
marks it finished when they stop; under torchrun rank 0 does both (launch/torchrun_join.py), naming torchrun's agent
as the launcher. `running_job` reads it and refuses, in one paragraph, a directory without a running job."""
from __future__ import annotations

import json
import os
import socket
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
    launcher_pid: int  # python -m rlhf_dyna's launcher, or torchrun's agent
    world_size: int  # at launch
    config: str  # the resolved config the joiner runs with
    finished: float | None = None  # time.time() when the launcher stopped the ranks (torchrun: when rank 0 ended)
    node: str = ""  # the host of the job's rank 0: its liveness checks of a joiner read this host's /proc


def this_node() -> str:
    return socket.gethostname()


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
                          "python -m rlhf_dyna or torchrun (placement=colocate or split) that is still running.")
    if not path.exists():
        raise LaunchError(
            f"elastic.join={run_dir}: this directory has no running job to join (no {JOIN_FILE}: the launcher writes "
            "it (under torchrun its rank 0 does) while a job that admits joins runs: placement=colocate or split, "
            "elastic.accept_joins not false). Give the run directory of such a job while it runs.")
    job = RunningJob(**json.loads(path.read_text()))
    if job.finished is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.finished))
        raise LaunchError(f"elastic.join={run_dir}: the job in this directory has finished (at {when}); there is no "
                          "world left to join. Start a new job, or join one that is still running.")
    if job.node and job.node != this_node():
        raise LaunchError(f"elastic.join={run_dir}: the job in this directory runs its rank 0 on host {job.node}, and "
                          f"this process runs on {this_node()}; a joiner's liveness is read from its host's process "
                          f"table, so it must run on {job.node}. Start python -m rlhf_dyna elastic.join={run_dir} "
                          "there.")
    if not _alive(job.launcher_pid):
        raise LaunchError(f"elastic.join={run_dir}: the job in this directory is not running (its launcher, pid "
                          f"{job.launcher_pid}, is gone without marking {JOIN_FILE} finished: it was killed). Start "
                          "a new job, or join one that is still running.")
    return job
