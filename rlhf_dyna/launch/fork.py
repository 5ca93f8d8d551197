"""Ranks forked from a launcher that has already imported the heavy modules.

Every spawned rank used to import torch, transformers and vLLM itself; on a few shared cores, four ranks importing at
once take twice as long as one import. A launcher that imports them once and forks the ranks shares that work, as
torch's DataLoader workers and vLLM's own workers do. Forking is safe here because the launcher has started no thread
when it forks, and `spawn_ranks` forks only where no GPU is visible and the launcher never initialised CUDA
(`devices.forks_ranks`): on a GPU node every rank is a fresh interpreter, since a child forked after any CUDA query
cannot use CUDA."""
from __future__ import annotations

import atexit
import gc
import importlib
import logging
import os
import runpy
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO

_REAP_POLL_S = 0.05


@contextmanager
def imports_without_gc() -> Iterator[None]:
    """The cyclic collector paused while torch, transformers and vLLM import: their objects live as long as the
    process, so the collections their allocations trigger find nothing (scripts/bench_startup.py measures what they
    cost); then imports_done."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        imports_done(enable=enabled)


def imports_done(enable: bool = True) -> None:
    """What the imports made is frozen, so that no later collection walks it, until the process exits (a normal exit
    frees it, or extension modules report it as leaked); then the collector runs again if `enable`."""
    gc.freeze()
    atexit.register(gc.unfreeze)
    if enable:
        gc.enable()


def preload(modules: Sequence[str], env: dict[str, str]) -> None:
    """Import `modules` into this process under the ranks' environment `env` (modules that read a variable when they
    load, as vLLM's logging does, see the ranks' value), so that ranks forked from it start with them loaded; an entry
    "module:function" also calls that function of the module once."""
    saved = dict(os.environ)
    try:
        os.environ.update(env)
        with imports_without_gc():
            for name in modules:
                module, _, setup = name.partition(":")
                loaded = importlib.import_module(module)
                if setup:  # "module:function": a one-time set-up the forked ranks inherit
                    getattr(loaded, setup)()
    finally:
        os.environ.clear()
        os.environ.update(saved)


class ForkedRank:
    """The part of `subprocess.Popen` the launcher uses, for a rank forked by `fork_rank`."""

    def __init__(self, pid: int, stdout: IO[bytes]):
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._lock = threading.Lock()  # poll() and wait() run on different threads; only one may reap

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)  # -N after signal N, as Popen
        return self.returncode

    def wait(self) -> int:
        while self.poll() is None:
            threading.Event().wait(_REAP_POLL_S)
        return self.returncode  # type: ignore[return-value]


def exit_status(err: SystemExit) -> int:
    """The process exit code a SystemExit stands for, as the interpreter would make it."""
    if err.code is None:
        return 0
    if isinstance(err.code, int):
        return err.code
    print(err.code, file=sys.stderr)  # sys.exit("message") prints the message and exits 1, as the interpreter does
    return 1


def exit_now(code: int) -> None:
    """Exit with `code` after the exit hooks and a flush, without tearing down the interpreter's modules: after
    torch, transformers and vLLM are loaded that teardown alone takes seconds. Never returns."""
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _run_rank(entry: str, args: list[str], env: dict[str, str], output_fd: int, close_fds: Sequence[int]) -> None:
    """In the child: a fresh session, the rank's env and output, then `python -m entry *args`. Never returns."""
    code = 1
    try:
        os.setsid()  # own process group: the launcher's killpg reaches this rank's children too
        for fd in close_fds:
            os.close(fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        os.close(output_fd)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)  # the launcher's handlers record a stop; a rank just stops
        atexit._clear()  # the launcher's exit hooks are not the rank's
        for handler in list(logging.root.handlers):  # nor its log handlers (Hydra's file and console)
            logging.root.removeHandler(handler)
        os.environ.clear()
        os.environ.update(env)
        if "torch" in sys.modules and "OMP_NUM_THREADS" in env:  # OpenMP read the launcher's value when it loaded
            sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))
        sys.argv = [entry, *args]
        gc.freeze()  # the launcher's imported heap: this rank's collections (vLLM runs five at start) skip it
        runpy.run_module(entry, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as err:
        code = exit_status(err)
    except BaseException:  # noqa: BLE001 -- a rank reports every failure as the interpreter would, then exits 1
        traceback.print_exc()
    finally:
        exit_now(code)


def fork_rank(entry: str, args: list[str], env: dict[str, str], close_fds: Sequence[int] = ()) -> ForkedRank:
    """Fork a rank that runs module `entry` with `args` and the environment `env`; its stdout and stderr come back
    through one pipe (the `stdout` of the result). `close_fds`: the parent's descriptors the child must not keep
    (earlier ranks' pipes)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _run_rank(entry, args, env, write_fd, close_fds)
    os.close(write_fd)
    return ForkedRank(pid, os.fdopen(read_fd, "rb"))
