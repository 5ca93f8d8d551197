"""RUN_DIR/join.json (launch/join_file.py): what `elastic.join=RUN_DIR` reads, and the one-paragraph refusals of a
directory without a running job: none there, no file, a finished job, a launcher that is gone; and of a job whose
rank 0 runs on another host (it reads a joiner's liveness from its own host's process table)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlhf_dyna.launch.host import LaunchError
from rlhf_dyna.launch.join_file import RunningJob, mark_finished, running_job, this_node, write_join_file


def job(pid: int, node: str = "") -> RunningJob:
    return RunningJob("127.0.0.1", 29500, "run-abc", pid, 3, "/runs/x/config_resolved.yaml", node=node)


def test_a_running_job_is_read_back(tmp_path):
    write_join_file(tmp_path, job(os.getpid()))
    assert running_job(tmp_path) == job(os.getpid())
    write_join_file(tmp_path, job(os.getpid(), this_node()))
    assert running_job(tmp_path).node == this_node()


@pytest.mark.parametrize("case,named", [
    ("no directory", "no such directory"),
    ("no file", "this directory has no running job to join (no join.json"),
    ("finished", "the job in this directory has finished (at "),
    ("launcher gone", "the job in this directory is not running (its launcher, pid"),
    ("other host", "the job in this directory runs its rank 0 on host elsewhere.example, and this process runs on"),
])
def test_a_directory_without_a_running_job_is_refused_in_one_paragraph(tmp_path, case, named):
    run_dir = tmp_path / "run"
    if case != "no directory":
        run_dir.mkdir()
    if case == "finished":
        write_join_file(run_dir, job(os.getpid()))
        mark_finished(run_dir)
    if case == "launcher gone":
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        write_join_file(run_dir, job(gone.pid))
    if case == "other host":
        write_join_file(run_dir, job(os.getpid(), "elsewhere.example"))
    with pytest.raises(LaunchError) as err:
        running_job(run_dir)
    assert named in str(err.value) and f"elastic.join={run_dir}" in str(err.value) and "\n" not in str(err.value)
