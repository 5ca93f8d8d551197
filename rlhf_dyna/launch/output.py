"""Where a run's output goes. Each rank's stdout and stderr go to `<run dir>/logs/rank<R>.log`, and what the launcher's
own imports print (vLLM's and Triton's notices, FutureWarnings) to `logs/launcher.log`; the console gets only what
tracking/console_view.py picks from rank 0's lines, and the launcher's error report. Under torchrun, where no
launcher of ours reads the ranks' output, `route_rank_output` does the same from inside each rank. `kill -USR1` of a
process of a run writes every thread's Python stack to `logs/<name>.stacks` (a hung run's state without a debugger)."""
from __future__ import annotations

import faulthandler
import io
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from rlhf_dyna.tracking.console import is_own_line

LOG_DIR = "logs"
LAUNCHER_LOG = "launcher.log"
ROUTED_ENV = "RLHF_DYNA_OUTPUT_ROUTED"  # set in the ranks of spawn_ranks, whose output the launcher routes
_console: IO[str] | None = None  # inside a rank routed by route_rank_output: the console it kept
STACKS_SIGNAL = signal.SIGUSR1
_stacks: IO[str] | None = None  # the file faulthandler writes this process's stacks to


def log_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / LOG_DIR


def rank_log(run_dir: Path | str, rank: int) -> Path:
    return log_dir(run_dir) / f"rank{rank}.log"


def stacks_file(run_dir: Path | str, name: str) -> Path:
    return log_dir(run_dir) / f"{name}.stacks"


def stacks_on_signal(run_dir: Path | str, name: str) -> None:
    """STACKS_SIGNAL makes this process write every thread's Python stack to stacks_file(run_dir, name) (appended)."""
    global _stacks
    path = stacks_file(run_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    stream = open(path, "a", encoding="utf-8")  # kept open: the handler writes to its descriptor, in C
    faulthandler.register(STACKS_SIGNAL, file=stream, all_threads=True)
    if _stacks is not None:
        _stacks.close()
    _stacks = stream


@contextmanager
def output_to(path: Path) -> Iterator[None]:
    """Descriptors 1 and 2 of this process (Python's and C's writes alike) go to `path` for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def pump(stream: IO[bytes], log_path: Path, on_line: Callable[[str], None] | None) -> None:
    """Copy a rank's output to its log file, handing each line to `on_line` (rank 0's go to the console view)."""
    with open(log_path, "wb") as log:
        for line in iter(stream.readline, b""):
            log.write(line)
            log.flush()
            if on_line is not None:
                on_line(line.decode(errors="replace").rstrip("\r\n"))


class _OwnLines(io.TextIOBase):
    """sys.stdout / sys.stderr of a routed rank: every line to the log, rlhf_dyna's own also to the console."""

    def __init__(self, log: IO[str], console: IO[str] | None) -> None:
        self.log, self.console, self._partial = log, console, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.log.write(text)
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            if self.console is not None and is_own_line(line):
                self.console.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.log.flush()
        if self.console is not None:
            self.console.flush()

    def fileno(self) -> int:
        return self.log.fileno()


def route_rank_output(run_dir: Path | str, rank: int, mode: str) -> None:
    """Inside a rank that no launcher of ours supervises (torchrun): this rank's output to its log file, rank 0's own
    lines to the console as well. Nothing to do under spawn_ranks (which routes from outside) or in verbose mode."""
    global _console
    if os.environ.get(ROUTED_ENV) or mode == "verbose":
        return
    path = rank_log(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    console = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace") if rank == 0 else None
    log = open(path, "a", buffering=1, encoding="utf-8", errors="replace")
    os.dup2(log.fileno(), 1)  # C and C++ writes (torch's, vLLM's) land in the log too
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = _OwnLines(log, console)
    _console = console
    print(f"rlhf_dyna: output in {run_dir}, rank logs in {log_dir(run_dir)}", flush=True)


def kept_console() -> IO[str] | None:
    """The console a routed rank kept (rank 0 under torchrun), for its error report; None elsewhere."""
    return _console
