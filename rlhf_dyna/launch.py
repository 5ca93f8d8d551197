"""Starting and supervising the ranks of a run.

Outside torchrun, `spawn_ranks` starts `world_size` local ranks itself and supervises them:
one failing rank or a signal to the launcher stops every rank (whole process groups), shows
the failing rank's error and removes the run's `/dev/shm` segments. Inside a rank (ours or
torchrun's, single or multi node), `init_distributed` joins the default process group.
"""
from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType, ModuleType
from typing import IO

import torch
import torch.distributed as dist

SHM_DIR = Path("/dev/shm")
RANKS_PER_CORE_LIMIT = 4
TERMINATE_GRACE_S = 5.0
ERROR_TAIL_LINES = 40
_POLL_S = 0.05
_VLLM_CPU_COMM = "vllm.distributed.device_communicators.cpu_communicator"


class LaunchError(RuntimeError):
    """A run that cannot start as asked; the message says what is wrong and what would work."""


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    backend: str
    device: torch.device
    run_ident: str


def under_torchrun() -> bool:
    """True when this process already is a rank of a launched world (torchrun, or any launcher
    that sets RANK/WORLD_SIZE/MASTER_ADDR, spawn_ranks included), so it must not spawn."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return True
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def local_device_kind() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


def _available_memory_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise LaunchError("cannot read MemAvailable from /proc/meminfo")


def check_capacity(world_size: int, device: str, mem_per_rank_bytes: int = 0) -> None:
    """Refuse a local world this machine cannot hold, before anything is spawned.

    For `cuda`, `world_size` counts the ranks on this node (one GPU each).
    """
    if world_size < 1:
        raise LaunchError(f"world_size={world_size} is not a valid number of ranks; it must be 1 or more.")
    if device == "cpu":
        cores = usable_cores()
        limit = RANKS_PER_CORE_LIMIT * cores
        if world_size > limit:
            raise LaunchError(
                f"world_size={world_size} CPU ranks is more than this machine can hold: it has {cores} usable "
                f"core(s) and at most {RANKS_PER_CORE_LIMIT} ranks per core ({limit} ranks) are allowed. "
                f"Use world_size <= {limit}, or run under torchrun across several nodes."
            )
        if mem_per_rank_bytes > 0:
            available = _available_memory_bytes()
            if world_size * mem_per_rank_bytes > available:
                fits = available // mem_per_rank_bytes
                raise LaunchError(
                    f"world_size={world_size} CPU ranks need about {world_size * mem_per_rank_bytes / 2**30:.1f} GiB "
                    f"({mem_per_rank_bytes / 2**30:.2f} GiB each) but only {available / 2**30:.1f} GiB is available; "
                    f"at most {fits} rank(s) fit. Use a smaller world_size or a smaller model."
                )
    elif device == "cuda":
        gpus = torch.cuda.device_count()
        if world_size > gpus:
            raise LaunchError(
                f"world_size={world_size} ranks on this node need one GPU each but {gpus} GPU(s) are visible "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). Use at most {gpus} "
                f"rank(s) per node, or spread the world over more nodes with torchrun."
            )
    else:
        raise LaunchError(f"device={device!r} is not supported; use 'cpu' or 'cuda'.")


def new_run_ident() -> str:
    # Becomes part of /dev/shm file names: no '/' allowed, short, unique per run.
    return f"rlhfdyna-{uuid.uuid4().hex[:12]}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- /dev/shm bookkeeping


def run_segments(run_ident: str) -> list[Path]:
    """The run's vLLM CPU segments: `<ident>-<group>-[<ranks>]-cpushm_<rank>` (see pin_vllm_shm_ident)."""
    if not SHM_DIR.is_dir():
        return []
    return sorted(p for p in SHM_DIR.iterdir() if p.name.startswith(f"{run_ident}-"))


def clean_shm_segments(run_ident: str, extra: list[Path] | tuple[Path, ...] = ()) -> list[str]:
    """Unlink the run's named segments and `extra` ones; returns the names removed."""
    removed = []
    for path in [*run_segments(run_ident), *extra]:
        try:
            path.unlink()
            removed.append(path.name)
        except FileNotFoundError:
            pass
    return removed


_pinned_ident = ""  # read by the patched make_group_name at call time, so re-pinning needs no re-patching


def _pin_module(module: ModuleType) -> None:
    shm_dist = getattr(module, "_CPUSHMDistributed", None)
    if shm_dist is None or getattr(shm_dist.make_group_name, "pinned_by_rlhf_dyna", False):
        return
    make_group_name = shm_dist.make_group_name

    def pinned_make_group_name(communicator: object) -> str:
        os.environ["VLLM_DIST_IDENT"] = _pinned_ident
        return make_group_name(communicator)

    pinned_make_group_name.pinned_by_rlhf_dyna = True  # type: ignore[attr-defined]
    shm_dist.make_group_name = staticmethod(pinned_make_group_name)


class _PinOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name != _VLLM_CPU_COMM:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_pin(module: ModuleType) -> None:
            exec_module(module)
            _pin_module(module)

        spec.loader.exec_module = exec_and_pin  # type: ignore[method-assign]
        return spec


def pin_vllm_shm_ident(run_ident: str) -> None:
    """Make vLLM name its CPU shm segments after this run.

    vLLM's CPU worker overwrites VLLM_DIST_IDENT with '//' under external_launcher, so every
    run would share the names `-tp:0-[0-1]-cpushm_<r>` and a crashed run would break the next
    (errno 17). We set it back right where the names are made; applied lazily on import so
    ranks that never use vLLM don't pay for importing it.
    """
    global _pinned_ident
    _pinned_ident = run_ident
    os.environ["VLLM_DIST_IDENT"] = run_ident
    module = sys.modules.get(_VLLM_CPU_COMM)
    if module is not None:
        _pin_module(module)
    elif not any(isinstance(f, _PinOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PinOnImport())


# ---------------------------------------------------------------- inside a rank


def _env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise LaunchError(f"{name} is not set: start ranks with rlhf_dyna.launch.spawn_ranks or torchrun.")
        return default
    return int(value)


def _agree_on_run_ident(device: torch.device) -> str:
    ident = os.environ.get("VLLM_DIST_IDENT")
    if ident:
        return ident
    # torchrun gives no per-run name every rank shares; rank 0 makes one.
    box = [new_run_ident() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0, device=device)
    return str(box[0])


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    sys.exit(128 + signum)  # SystemExit runs atexit, which removes this run's shm segments


def init_distributed(timeout: timedelta | None = None) -> DistInfo:
    """Join the default process group from the env that spawn_ranks or torchrun set."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise LaunchError(
            f"{', '.join(missing)} not set: this process is not a launched rank. Start it through "
            f"rlhf_dyna.launch.spawn_ranks (python -m rlhf_dyna) or torchrun."
        )
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
    node_rank = _env_int("GROUP_RANK", rank // local_world_size)
    if torch.cuda.is_available():  # CUDA tensors over NCCL; metrics and control tensors on the CPU over gloo
        backend, device = "cpu:gloo,cuda:nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
    run_ident = _agree_on_run_ident(device)
    pin_vllm_shm_ident(run_ident)
    atexit.register(clean_shm_segments, run_ident)
    if "TORCHELASTIC_RUN_ID" in os.environ and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    return DistInfo(rank, world_size, local_rank, local_world_size, node_rank, backend, device, run_ident)


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------- the launcher


def _process_table() -> list[tuple[int, int, str]]:
    """(pid, pgid, state) of every live process; zombies are reported with state 'Z'."""
    table = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # comm may contain spaces and ')'
        table.append((int(entry.name), int(fields[2]), fields[0]))
    return table


def group_members(pgids: set[int]) -> list[int]:
    """PIDs, zombies excluded, whose process group is one of `pgids`."""
    return [pid for pid, pgid, state in _process_table() if pgid in pgids and state != "Z"]


def _mapped_shm(pids: list[int]) -> set[Path]:
    """/dev/shm files the given processes have mapped (vLLM's psm_* message queues among them)."""
    found = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
            if len(fields) == 6 and fields[5].startswith(f"{SHM_DIR}/") and not fields[5].endswith(" (deleted)"):
                found.add(Path(fields[5]))
    return found


def _signal_groups(pgids: set[int], sig: int) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _stop_groups(procs: list[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM every rank's process group, SIGKILL what is left after `grace_s`, reap the ranks."""
    pgids = {p.pid for p in procs}
    _signal_groups(pgids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        for p in procs:
            p.poll()
        if not group_members(pgids):
            break
        time.sleep(_POLL_S)
    else:
        _signal_groups(pgids, signal.SIGKILL)
    for p in procs:
        p.wait()


def _rank_env(rank: int, world_size: int, port: int, run_ident: str, extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra or {})
    env.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
        GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), VLLM_DIST_IDENT=run_ident,
        VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONUNBUFFERED="1",
    )
    # N ranks share the cores; more threads than that only thrash.
    env.setdefault("OMP_NUM_THREADS", str(max(1, usable_cores() // world_size)))
    return env


def _pump(stream: IO[bytes], log_path: Path, echo: bool) -> None:
    with open(log_path, "wb") as log:
        for line in iter(stream.readline, b""):
            log.write(line)
            log.flush()
            if echo:
                sys.stdout.buffer.write(line)
                sys.stdout.flush()


def _report_exit(rank: int, proc: subprocess.Popen[bytes], exits: queue.Queue[int]) -> None:
    proc.wait()
    exits.put(rank)


def _tail(path: Path, lines: int) -> str:
    with open(path, "rb") as f:
        return b"".join(deque(f, maxlen=lines)).decode(errors="replace")


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def spawn_ranks(
    world_size: int,
    entry: str,
    args: list[str],
    run_dir: Path,
    env: dict[str, str] | None = None,
    grace_s: float = TERMINATE_GRACE_S,
) -> int:
    """Run `python -m entry *args` (or `python entry *args` for a .py path) as `world_size` local
    ranks and supervise them; returns the exit code for the launcher (0, the failing rank's
    code, or 130/143 after SIGINT/SIGTERM). Each rank's output goes to run_dir/rank{r}.log;
    rank 0's is also echoed to stdout."""
    check_capacity(world_size, local_device_kind())
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    run_ident = new_run_ident()
    port = free_port()
    command = [sys.executable, entry] if entry.endswith(".py") else [sys.executable, "-m", entry]

    stop_signal: list[int] = []
    previous_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous_handlers[sig] = signal.signal(sig, lambda signum, frame: stop_signal.append(signum))

    procs: list[subprocess.Popen[bytes]] = []
    pumps: list[threading.Thread] = []
    exits: queue.Queue[int] = queue.Queue()  # ranks in the order they exited: the first failure is the cause
    try:
        for rank in range(world_size):
            proc = subprocess.Popen(
                [*command, *args], env=_rank_env(rank, world_size, port, run_ident, env),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: killpg reaches vLLM's and torch's children
            )
            procs.append(proc)
            pump = threading.Thread(target=_pump, args=(proc.stdout, run_dir / f"rank{rank}.log", rank == 0), daemon=True)
            pump.start()
            pumps.append(pump)
            threading.Thread(target=_report_exit, args=(rank, proc, exits), daemon=True).start()

        failed_rank: int | None = None
        finished = 0
        while not stop_signal and failed_rank is None and finished < world_size:
            try:
                rank = exits.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            finished += 1
            if procs[rank].returncode != 0:
                failed_rank = rank

        stale = _mapped_shm(group_members({p.pid for p in procs}))
        _stop_groups(procs, grace_s)
        for pump in pumps:
            pump.join(timeout=grace_s)
        clean_shm_segments(run_ident, sorted(stale))
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        if any(p.poll() is None for p in procs):  # an exception of our own above: leave nothing behind
            _stop_groups(procs, grace_s)
            clean_shm_segments(run_ident)

    if stop_signal:
        print(f"rlhf_dyna.launch: stopped all {world_size} ranks on signal {stop_signal[0]}.", file=sys.stderr)
        return 128 + stop_signal[0]
    if failed_rank is not None:
        code = _exit_code(procs[failed_rank].returncode)
        log = run_dir / f"rank{failed_rank}.log"
        print(
            f"rlhf_dyna.launch: rank {failed_rank} of {world_size} failed with exit code {code}; stopped the "
            f"other ranks. Last {ERROR_TAIL_LINES} lines of {log}:\n{_tail(log, ERROR_TAIL_LINES)}",
            file=sys.stderr,
        )
        return code
    return 0
