"""A rank's failure, recorded the moment it reaches the rank's top level, so the launcher can show its cause last.

When one rank fails, its peers fail after it ("Connection closed by peer" in their next collective) and vLLM's exit
handlers add errors of their own ("Invalid process group specified"); the tail of a log is then noise. Each rank
writes its error, before it tears anything down, to the file torchrun's agent reads (`TORCHELASTIC_ERROR_FILE`, in
torch's string-message format, which its summary prints); `spawn_ranks` gives every rank such a file and shows the
earliest one. A ConfigError (a bad value or a user's reward function, found in a rank) is its one paragraph; any other
exception is its traceback."""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from rlhf_dyna.errors import ConfigError
from rlhf_dyna.launch.output import kept_console, log_dir

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


def error_file(run_dir: Path | str, rank: int) -> Path:
    return log_dir(run_dir) / f"rank{rank}.error.json"


def _config_error_in(err: BaseException) -> ConfigError | None:
    """`err` or the exception it was raised while handling, if one of them is ours to explain in one paragraph."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, ConfigError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def failure_report(err: BaseException) -> str:
    own = _config_error_in(err)
    if own is not None:
        return f"rlhf_dyna: error: {own}"
    return "".join(traceback.format_exception(err)).rstrip("\n")


def record_failure(err: BaseException, rank: int) -> None:
    """Write `err`'s report where the launcher (ours or torchrun) looks for it; call before any teardown. A routed
    rank 0 under torchrun also prints it on the console it kept (the traceback itself goes to its log)."""
    report = failure_report(err)
    now = time.time()
    path = os.environ.get(ERROR_FILE_ENV)
    if path:
        Path(path).write_text(json.dumps({"message": report, "timestamp": str(int(now)), "time": now, "rank": rank}))
    console = kept_console()
    if console is not None:
        console.write(report + "\n")
        console.flush()
    sys.stderr.flush()


@dataclass(frozen=True)
class RankFailure:
    rank: int
    time: float
    report: str


def read_failure(path: Path) -> RankFailure | None:
    try:
        record = json.loads(path.read_text())
        return RankFailure(int(record["rank"]), float(record["time"]), str(record["message"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no record (killed, or failed before it could write one)


def first_failure(paths: list[Path]) -> RankFailure | None:
    """The earliest recorded failure among these files: the cause; the later ones are its consequences."""
    failures = [f for f in map(read_failure, paths) if f is not None]
    return min(failures, key=lambda f: f.time) if failures else None
