"""What the live elastic tests read from a run's rank logs."""
from __future__ import annotations

import time
from pathlib import Path


def announced_pid(run_dir: Path, rank: int, deadline: float, marker: str) -> int:
    """The pid `rank` announces on the line of its log that names `marker` ("SIGTERM": it takes SIGTERM as a request
    to leave; "holds the replica": its replica duty under elastic.replicas)."""
    log = run_dir / "logs" / f"rank{rank}.log"
    while time.monotonic() < deadline:
        for line in (log.read_text() if log.exists() else "").splitlines():
            if f"rank {rank} (pid " in line and marker in line:
                return int(line.split("(pid ")[1].split(")")[0])
        time.sleep(0.2)
    raise TimeoutError(f"rank {rank} never announced its pid in {log}")
