"""The launcher outside torchrun: start `world_size` local ranks and supervise them.

One failing rank or a signal to the launcher stops every rank (whole process groups), shows the failing rank's
error (the first one recorded, launch/failure.py) and removes the run's `/dev/shm` segments and its node-local
files (launch/scratch.py). What reaches the console
is decided in launch/output.py and tracking/console_view.py: the lines of rank 0, which is the lowest-numbered
process still running (after rank 0 leaves the job, or is lost and the survivors recover, the first survivor is rank
0). The job's TCPStore is served from this process (launch/job_store.py), as torchrun's agent serves its agent store,
so any rank may leave the job or be lost."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from collections.abc import Sequence

from rlhf_dyna.tracking.console_view import ConsoleView

from .devices import cuda_initialised, forks_ranks
from .failure import ERROR_FILE_ENV, RankFailure, error_file, first_failure, read_failure
from .fork import ForkedRank, fork_rank, preload as preload_modules
from .host import AGENT_STORE_ENV, check_capacity, free_port, new_run_ident, usable_cores, visible_gpu_count
from .join_file import RunningJob, mark_finished, this_node, write_join_file
from .joiner_watch import POLL_S as JOINERS_POLL_S, JoinerWatch
from .lost_ranks import LossHandler, settle
from .output import LAUNCHER_LOG, ROUTED_ENV, log_dir, output_to, pump, rank_log
from .scratch import clean_scratch
from .shm import SHM_DIR, clean_shm_segments

JOINER_ENV = "RLHF_DYNA_JOINER"  # set in joiner process k (elastic.events join@S): it enters the world later
TERMINATE_GRACE_S = 5.0
ERROR_TAIL_LINES = 40
_POLL_S = 0.05


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


def mapped_shm(pids: list[int]) -> set[Path]:
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


Rank = subprocess.Popen | ForkedRank


def _stop_groups(procs: list[Rank], grace_s: float) -> None:
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
        **{AGENT_STORE_ENV: str(True)},  # env:// connects every rank to the launcher's store, rank 0 included
    )
    # N ranks share the cores; more threads than that only thrash.
    env.setdefault("OMP_NUM_THREADS", str(max(1, usable_cores() // world_size)))
    return env


def _report_exit(rank: int, proc: Rank, exits: queue.Queue[tuple[int, float]]) -> None:
    proc.wait()
    exits.put((rank, time.time()))


def _first_running(procs: list[Rank], default: int) -> int:
    """The lowest-numbered process still running (rank 0 of the current world), else `default`."""
    return next((i for i, p in enumerate(procs) if p.poll() is None), default)


def _next_exit(exits: queue.Queue[tuple[int, float]], timeout: float) -> tuple[int, float] | None:
    try:
        return exits.get(timeout=timeout)
    except queue.Empty:
        return None


def _tail(path: Path, lines: int) -> str:
    with open(path, "rb") as f:
        return b"".join(deque(f, maxlen=lines)).decode(errors="replace")


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _output_env(run_dir: Path, rank: int) -> dict[str, str]:
    """What a rank needs to route and record (launch/output.py, launch/failure.py)."""
    return {ERROR_FILE_ENV: str(error_file(run_dir, rank)), ROUTED_ENV: "1"}


def _preload(modules: Sequence[str], env: dict[str, str], run_dir: Path, console: str) -> None:
    """The heavy imports, their notices (Triton, vLLM, FutureWarnings) to logs/launcher.log unless verbose."""
    if console == "verbose":
        preload_modules(modules, env)
        return
    with output_to(log_dir(run_dir) / LAUNCHER_LOG):
        preload_modules(modules, env)


def _cause(failed_rank: int, exit_time: float, world_size: int, run_dir: Path) -> RankFailure | None:
    """The failure to show: the earliest a rank recorded, unless the first rank to fail left no record and exited
    before that one was written (killed by a signal, or gone before its top level): then it is the cause."""
    recorded = first_failure([error_file(run_dir, r) for r in range(world_size)])
    if recorded is None or (read_failure(error_file(run_dir, failed_rank)) is None and exit_time < recorded.time):
        return None
    return recorded


def _report_failure(failed_rank: int, code: int, exit_time: float, world_size: int, run_dir: Path) -> None:
    cause = _cause(failed_rank, exit_time, world_size, run_dir)
    if cause is None:
        log = rank_log(run_dir, failed_rank)
        print(f"rlhf_dyna: rank {failed_rank} of {world_size} failed with exit code {code}; stopped the other ranks. "
              f"Last {ERROR_TAIL_LINES} lines of {log}:\n{_tail(log, ERROR_TAIL_LINES)}", file=sys.stderr)
        return
    print(f"rlhf_dyna: rank {cause.rank} of {world_size} failed; stopped the other ranks (its log: "
          f"{rank_log(run_dir, cause.rank)}).\n{cause.report}", file=sys.stderr)


def spawn_ranks(
    world_size: int,
    entry: str,
    args: list[str],
    run_dir: Path,
    env: dict[str, str] | None = None,
    grace_s: float = TERMINATE_GRACE_S,
    preload: Sequence[str] = (),
    console: str = "progress",
    joiners: int = 0,
    join_config: Path | None = None,
    replicas: bool = False,
    checkpoint_recovery: bool = False,
) -> int:
    """Run `python -m entry *args` (or `python entry *args` for a .py path) as `world_size` local
    ranks and supervise them; returns the exit code for the launcher (0, the failing rank's
    code, or 130/143 after SIGINT/SIGTERM). Each rank's output goes to run_dir/logs/rank{r}.log; the console shows
    what `console` (a tracking.console mode) picks of rank 0's (tracking/console_view.py). With `preload` (module
    names; `entry` must be a module), this process imports those modules once and forks the ranks from itself
    (launch/fork.py) instead of starting interpreters, unless a GPU is visible or this process has initialised CUDA
    (launch/devices.py): then every rank is a fresh interpreter whatever `preload` says. `joiners`: processes started
    beside the world (elastic.events join@S) with JOINER_ENV set to 0, 1, ...; they prepare, wait for their step
    boundary and enter the world then (orchestrator/joiner.py); joiner k's log is rank{world_size + k}.log.
    `join_config`: the job admits `elastic.join=RUN_DIR` processes, which run with this resolved config: run_dir/join.json
    says where the job's store is while the ranks run (launch/join_file.py). A joiner (of either kind) that dies before
    the world admits it is dropped, and the run goes on; one that dies after is a lost rank (launch/joiner_watch.py). `replicas` (elastic.replicas=1) and
    `checkpoint_recovery` (elastic.recover_from_checkpoint): a rank that dies does not stop the run where the survivors
    can rebuild its state from the replicas or from a complete checkpoint under run_dir/checkpoints (launch/lost_ranks.py)."""
    gpus = visible_gpu_count()
    processes = world_size + joiners
    check_capacity(processes, "cuda" if gpus else "cpu")
    run_dir = Path(run_dir)
    log_dir(run_dir).mkdir(parents=True, exist_ok=True)
    run_ident = new_run_ident()
    port = free_port()
    command = [sys.executable, entry] if entry.endswith(".py") else [sys.executable, "-m", entry]
    if preload and entry.endswith(".py"):
        raise ValueError(f"spawn_ranks: preload forks the ranks and runs a module; got the script {entry}")
    fork = bool(preload) and forks_ranks(gpus, cuda_initialised())
    for rank in range(processes):  # a run dir reused (resume) must not show an earlier run's failure
        error_file(run_dir, rank).unlink(missing_ok=True)
    view = ConsoleView(console)
    try:
        view.status(f"starting {world_size} ranks...")
        if fork:
            _preload(preload, _rank_env(0, world_size, port, run_ident, env), run_dir, console)
    except BaseException:
        view.close()
        raise

    stop_signal: list[int] = []
    previous_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous_handlers[sig] = signal.signal(sig, lambda signum, frame: stop_signal.append(signum))

    if join_config is not None:
        write_join_file(run_dir, RunningJob("127.0.0.1", port, run_ident, os.getpid(), world_size, str(join_config),
                                            node=this_node()))
    procs: list[Rank] = []
    pumps: list[threading.Thread] = []
    exits: queue.Queue[tuple[int, float]] = queue.Queue()  # (rank, when) in the order they exited
    failed_rank: int | None = None
    dropped: set[int] = set()  # joiners that died before the world admitted them
    try:
        for rank in range(processes):  # every rank starts before any thread of ours does: forking stays safe
            rank_env = {**_rank_env(rank, world_size, port, run_ident, env), **_output_env(run_dir, rank)}
            if rank >= world_size:
                rank_env[JOINER_ENV] = str(rank - world_size)
            if fork:
                procs.append(fork_rank(entry, args, rank_env, close_fds=[p.stdout.fileno() for p in procs]))
            else:
                procs.append(subprocess.Popen(
                    [*command, *args], env=rank_env,
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: killpg reaches vLLM's and torch's children
                ))
        from .job_store import serve_job_store  # torch.distributed: not before a refusal, nor before the forks

        store = serve_job_store(port)  # its server thread starts after the last fork
        shown = [0]  # the process whose lines the console shows: rank 0, the lowest-numbered one still running
        for rank, proc in enumerate(procs):
            on_line = (lambda line, i=rank: view.rank_line(line) if shown[0] == i else None)
            pump_thread = threading.Thread(target=pump, args=(proc.stdout, rank_log(run_dir, rank), on_line), daemon=True)
            pump_thread.start()
            pumps.append(pump_thread)
            threading.Thread(target=_report_exit, args=(rank, proc, exits), daemon=True).start()
        view.start()  # the live display's thread starts after the forks, as ours do

        finished, exit_time, lost_why, joined_why = 0, 0.0, None, None
        losses = LossHandler(world_size, port, replicas, run_dir / "checkpoints" if checkpoint_recovery else None) \
            if replicas or checkpoint_recovery else None
        watch, looked = JoinerWatch(world_size, port), time.monotonic()
        while not stop_signal and failed_rank is None and joined_why is None and finished < processes:
            if join_config is not None and time.monotonic() - looked > JOINERS_POLL_S:  # elastic.join processes
                looked = time.monotonic()
                for name in watch.poll():
                    joined_why = joined_why or losses.on_deaths([name], time.time()) if losses is not None else (
                        f"{name}, a rank of the world since its join, died; without elastic.replicas=1 (or "
                        "elastic.recover_from_checkpoint) a lost rank stops the run. Resume it with trainer.resume=auto.")
            try:
                rank, when = exits.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            finished += 1
            if rank >= world_size and procs[rank].returncode != 0 and \
                    watch.launched_exit(rank, _exit_code(procs[rank].returncode)) is None:
                dropped.add(rank)  # a joiner that never entered: the world goes on without it
                continue
            if procs[rank].returncode != 0 and losses is not None:
                deaths = settle((rank, when), lambda left: _next_exit(exits, left))
                finished += len(deaths) - 1
                if procs[shown[0]].poll() is not None:  # rank 0 lost: its successor's lines, before it is told
                    shown[0] = _first_running(procs, shown[0])
                lost_why = losses.on_deaths([r for r, _ in deaths if procs[r].returncode != 0], when)
                if lost_why is None:
                    continue
            if procs[rank].returncode != 0:
                failed_rank, exit_time = rank, when
            elif rank == shown[0]:  # rank 0 left the job (or the run ended): its successor is the first still running
                shown[0] = _first_running(procs, rank)

        stale = mapped_shm(group_members({p.pid for p in procs}))
        _stop_groups(procs, grace_s)
        for pump_thread in pumps:
            pump_thread.join(timeout=grace_s)
        clean_shm_segments(run_ident, sorted(stale))
        clean_scratch(run_ident)  # the snapshots' own copies, a killed rank's too
        del store  # its server stops: a process still asking to join learns that the job has ended
    finally:
        if join_config is not None:
            mark_finished(run_dir)
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        if any(p.poll() is None for p in procs):  # an exception of our own above: leave nothing behind
            _stop_groups(procs, grace_s)
            clean_shm_segments(run_ident)
            clean_scratch(run_ident)
        lost = (losses.lost_processes if losses is not None else set()) | dropped
        if not stop_signal and failed_rank is None and joined_why is None and procs and all(p.returncode == 0 for i, p in enumerate(procs)
                                                                     if i not in lost):
            view.status(f"finished in {view.elapsed}; output in {run_dir}, rank logs in {log_dir(run_dir)}")
        view.close()

    if stop_signal:
        print(f"rlhf_dyna: stopped all {world_size} ranks on signal {stop_signal[0]}.", file=sys.stderr)
        return 128 + stop_signal[0]
    if joined_why is not None:
        print(f"rlhf_dyna: {joined_why}", file=sys.stderr)
        return 1
    if failed_rank is not None and lost_why is not None:
        print(f"rlhf_dyna: {lost_why}", file=sys.stderr)
        return _exit_code(procs[failed_rank].returncode)
    if failed_rank is not None:
        code = _exit_code(procs[failed_rank].returncode)
        _report_failure(failed_rank, code, exit_time, processes, run_dir)
        return code
    return 0
