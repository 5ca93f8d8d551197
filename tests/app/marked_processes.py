"""Finding what a run left behind: every process of a run started with MARK in its environment inherits it (ranks,
vLLM engine cores, their children), so a test can list the survivors after the launcher has returned. A run forked
from the tests' forkserver (app_runs.run_app) has no environment of its own in /proc: it runs with its run directory
as working directory instead, which its processes inherit the same way."""
from __future__ import annotations

import os
from pathlib import Path

MARK = "RLHF_DYNA_TEST_RUN"


def marked_processes(mark: str) -> list[int]:
    """PIDs of live (not zombie) processes whose environment holds MARK=mark, or whose working directory is `mark`."""
    pids, where = [], os.path.realpath(mark)
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (f"{MARK}={mark}".encode() in (proc / "environ").read_bytes().split(b"\0")
                                        or os.readlink(proc / "cwd") == where):
                if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(proc.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return pids
