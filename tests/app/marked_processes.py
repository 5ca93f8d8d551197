"""Finding what a run left behind: every process of a run started with MARK in its environment inherits it (ranks,
vLLM engine cores, their children), so a test can list the survivors after the launcher has returned."""
from __future__ import annotations

from pathlib import Path

MARK = "RLHF_DYNA_TEST_RUN"


def marked_processes(mark: str) -> list[int]:
    """PIDs of live (not zombie) processes whose environment holds MARK=mark."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"{MARK}={mark}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(proc.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return pids
