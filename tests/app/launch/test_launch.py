"""Launch and supervision with real processes: local spawning, failures, signals, /dev/shm, torchrun (the refusals
before any process starts: tests/unit/launch/test_launch.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlhf_dyna.launch import SHM_DIR, free_port, new_run_ident, run_segments, spawn_ranks, usable_cores

WORKERS = str(Path(__file__).with_name("workers.py"))
REPO_ROOT = Path(__file__).parents[3]
CRASH_TEXT = "rank one blew up on purpose (launch test)"  # as in workers.py, which tests must not import
CONFIG_ERROR_TEXT = "reward 'x:y' raised on purpose (launch test); its traceback would follow"
WORKERS_MODULE = "tests.app.launch.workers"
# each supervision test runs with ranks started as interpreters (a script entry) and forked from a launcher that
# imported torch first (launch/fork.py, what `python -m rlhf_dyna` does)
START = pytest.mark.parametrize("entry, preload", [(WORKERS, ()), (WORKERS_MODULE, ("torch",))], ids=["exec", "fork"])


def _results(out_dir: Path, world_size: int) -> list[dict]:
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world_size)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _pids(out_dir: Path) -> list[int]:
    return [int(p) for f in sorted(out_dir.glob("rank*.pids")) for p in f.read_text().split()]


def _assert_no_traces(out_dir: Path) -> None:
    pids = _pids(out_dir)
    assert len(pids) == 3, "two ranks and rank 0's grandchild should have recorded their pids"
    assert [p for p in pids if _alive(p)] == []
    assert not (SHM_DIR / (out_dir / "psm_name").read_text()).exists()
    assert run_segments((out_dir / "run_ident").read_text()) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size, entry, preload", [(2, WORKERS_MODULE, ()), (3, WORKERS, ()),
                                                         (3, WORKERS_MODULE, ("torch",))])
def test_spawned_ranks_all_reduce(tmp_path: Path, world_size: int, entry: str, preload: tuple[str, ...]) -> None:
    """A module entry (with the ranks' extra env), a script path entry, and forked ranks."""
    env = {"PYTHONPATH": str(REPO_ROOT)}
    assert spawn_ranks(world_size, entry, ["all_reduce", str(tmp_path)], tmp_path / "run", env=env,
                       preload=preload) == 0
    results = _results(tmp_path, world_size)
    assert [r["sum"] for r in results] == [world_size * (world_size + 1) / 2] * world_size
    assert [(r["rank"], r["local_rank"], r["node_rank"]) for r in results] == [(r, r, 0) for r in range(world_size)]
    assert {r["world_size"] for r in results} == {world_size}
    assert {r["local_world_size"] for r in results} == {world_size}
    assert {r["backend"] for r in results} == {"gloo"}
    assert len({r["run_ident"] for r in results}) == 1
    omp = os.environ.get("OMP_NUM_THREADS", str(max(1, usable_cores() // world_size)))
    assert {r["omp"] for r in results} == {omp} and {r["torch_threads"] for r in results} == {int(omp)}
    assert {r["pythonpath"] for r in results} == {str(REPO_ROOT)}
    assert all(r["under_torchrun"] for r in results)  # a spawned rank must not spawn again
    assert all((tmp_path / "run" / "logs" / f"rank{r}.log").exists() for r in range(world_size))
    assert run_segments(results[0]["run_ident"]) == []


@pytest.mark.timeout(60)
@START
def test_crashing_rank_stops_all_and_cleans_up(tmp_path: Path, capfd: pytest.CaptureFixture[str], entry: str,
                                               preload: tuple[str, ...]) -> None:
    code = spawn_ranks(2, entry, ["crash", str(tmp_path)], tmp_path / "run", grace_s=3.0, preload=preload)
    stop_s = time.time() - float((tmp_path / "crash_time").read_text())
    err = capfd.readouterr().err
    assert code == 1
    assert CRASH_TEXT in err and "rank 1 of 2 failed" in err and "Traceback" in err
    assert stop_s < 5, f"{stop_s:.1f}s from the crash to the launcher's return"
    _assert_no_traces(tmp_path)


@pytest.mark.timeout(60)
@START
def test_first_recorded_failure_is_shown_last(tmp_path: Path, capfd: pytest.CaptureFixture[str], entry: str,
                                              preload: tuple[str, ...]) -> None:
    """Rank 1's error, recorded before its teardown, is the launcher's last word: not its later noise, not rank 0's
    collective failing after it."""
    code = spawn_ranks(2, entry, ["config_error", str(tmp_path)], tmp_path / "run", grace_s=3.0, preload=preload)
    err = capfd.readouterr().err
    assert code != 0
    assert err.rstrip().endswith(f"rlhf_dyna: error: {CONFIG_ERROR_TEXT}"), err
    assert "rank 1 of 2 failed" in err and "Invalid process group" not in err and "Traceback" not in err
    recorded = [json.loads((tmp_path / "run" / "logs" / f"rank{r}.error.json").read_text()) for r in (0, 1)]
    assert recorded[1]["time"] < recorded[0]["time"], "rank 0 failed because rank 1 did, so after it"
    assert "Invalid process group" in (tmp_path / "run" / "logs" / "rank1.log").read_text(), "the noise stays in the log"
    assert len(_pids(tmp_path)) == 2 and not any(_alive(p) for p in _pids(tmp_path))


@pytest.mark.timeout(60)
@START
def test_the_store_outlives_rank_0_and_the_console_follows_its_successor(tmp_path: Path,
                                                                         capfd: pytest.CaptureFixture[str], entry: str,
                                                                         preload: tuple[str, ...]) -> None:
    """The launcher serves the job's store, so rank 0 may exit first (an elastic leave); the console shows rank 0's
    lines, then those of the lowest-numbered process still running."""
    code = spawn_ranks(2, entry, ["rank0_leaves", str(tmp_path)], tmp_path / "run", preload=preload,
                       env={"PYTHONPATH": str(REPO_ROOT)}, console="plain")
    out = capfd.readouterr().out
    assert code == 0, out
    assert "rlhf_dyna: rank 0 speaks before rank 0 leaves" in out
    assert "rank 1 speaks before" not in out, "rank 1's lines reach the console only once it is the first running"
    assert "rlhf_dyna: rank 1 speaks after rank 0 left; the job's store says still served" in out


@pytest.mark.timeout(60)
@START
def test_a_recovered_loss_of_rank_0_moves_the_console_to_its_successor(tmp_path: Path,
                                                                        capfd: pytest.CaptureFixture[str], entry: str,
                                                                        preload: tuple[str, ...]) -> None:
    """With lost ranks recovered (replicas), rank 0's SIGKILL does not stop the run: the launcher announces it on the
    job's store, the console shows the first survivor's lines from then on, and the run ends with exit code 0."""
    code = spawn_ranks(2, entry, ["rank0_lost", str(tmp_path)], tmp_path / "run", preload=preload,
                       env={"PYTHONPATH": str(REPO_ROOT)}, console="plain", replicas=True)
    captured = capfd.readouterr()
    assert code == 0, captured.out + captured.err
    assert "rank 0 of 2 lost (process 0); the survivors rebuild its state from the replicas" in captured.err
    assert "rlhf_dyna: rank 0 speaks before rank 0 is lost" in captured.out
    assert "rank 1 speaks before" not in captured.out, "rank 1's lines reach the console once it is rank 0"
    assert "rlhf_dyna: rank 1 speaks after rank 0 was lost; announced [0]" in captured.out, captured.out


@pytest.mark.timeout(60)
@START
@pytest.mark.parametrize("sig, expected", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_launcher_stops_all(tmp_path: Path, sig: signal.Signals, expected: int, entry: str,
                                      preload: tuple[str, ...]) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from pathlib import Path; from rlhf_dyna.launch import spawn_ranks; "
         f"sys.exit(spawn_ranks(2, {entry!r}, ['hang', {str(tmp_path)!r}], Path({str(tmp_path / 'run')!r}), "
         f"preload={preload!r}))"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
    )
    deadline = time.monotonic() + 40
    while not all((tmp_path / f"ready{r}").exists() for r in range(2)):
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.1)
    launcher.send_signal(sig)
    out, err = launcher.communicate(timeout=15)
    assert launcher.returncode == expected, err
    assert f"on signal {int(sig)}" in err
    _assert_no_traces(tmp_path)


@pytest.mark.timeout(60)
def test_pinned_ident_names_vllms_cpu_segments() -> None:
    """vLLM's CPU worker sets VLLM_DIST_IDENT to '//' before making its segments; ours must win."""
    first, second, third = new_run_ident(), new_run_ident(), new_run_ident()
    code = (
        "import os, types; from rlhf_dyna.launch import pin_vllm_shm_ident\n"
        f"pin_vllm_shm_ident({first!r}); pin_vllm_shm_ident({second!r})\n"
        "from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed\n"
        "group = types.SimpleNamespace(unique_name='tp:0', ranks=[0, 1])\n"
        "os.environ['VLLM_DIST_IDENT'] = '//'\n"
        "print(_CPUSHMDistributed.make_group_name(group))\n"
        f"pin_vllm_shm_ident({third!r}); os.environ['VLLM_DIST_IDENT'] = '//'\n"
        "print(_CPUSHMDistributed.make_group_name(group))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-2:] == [f"{second}-tp:0-[0-1]-cpushm", f"{third}-tp:0-[0-1]-cpushm"]


@pytest.mark.timeout(60)
def test_vllms_tp_reduces_over_gloo_where_a_lost_rank_is_survived() -> None:
    """vllm_tp_over_gloo(True): no group takes vLLM's shm ring (its spin on a dead peer has no way out), every rank
    alike, without the check's collective; False: vLLM's own check decides."""
    code = (
        "import types; from rlhf_dyna.launch import pin_vllm_shm_ident\n"
        "from rlhf_dyna.launch.shm import vllm_tp_over_gloo\n"
        "pin_vllm_shm_ident('probe'); vllm_tp_over_gloo(True)\n"
        "from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator\n"
        "print(CpuCommunicator._all_group_ranks_share_shm_group_name(types.SimpleNamespace()))\n"
        "vllm_tp_over_gloo(False)\n"
        "try:\n    CpuCommunicator._all_group_ranks_share_shm_group_name(types.SimpleNamespace())\n"
        "except AttributeError:\n    print('vllm decides')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-2:] == ["False", "vllm decides"], out.stdout


@pytest.mark.timeout(90)
def test_two_node_rendezvous_on_loopback(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("VLLM_DIST_IDENT", None)
    agents = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", tmp_path.name,
             "--node-rank", str(node), "--max-restarts", "0", WORKERS, "all_reduce", str(tmp_path)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for node in range(2)
    ]
    outputs = [a.communicate(timeout=75)[0] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], "\n".join(outputs)
    results = _results(tmp_path, 2)
    assert [r["sum"] for r in results] == [3.0, 3.0]
    assert sorted(r["node_rank"] for r in results) == [0, 1]
    assert all(r["rank"] == r["node_rank"] and r["local_rank"] == 0 and r["local_world_size"] == 1 for r in results)
    assert all(r["under_torchrun"] for r in results)
    assert len({r["run_ident"] for r in results}) == 1, "ranks must agree on one shm name per run"


@pytest.mark.timeout(60)
def test_forked_rank_exit_codes_and_output(tmp_path: Path) -> None:
    """sys.exit(3) is code 3, sys.exit("text") prints text and is 1, a kill by signal is 128 + N; output arrives."""
    assert spawn_ranks(1, WORKERS_MODULE, ["exit_3", str(tmp_path)], tmp_path / "a", preload=("torch",)) == 3
    assert spawn_ranks(1, WORKERS_MODULE, ["exit_text", str(tmp_path)], tmp_path / "b", preload=("torch",)) == 1
    assert "stopping with a message" in (tmp_path / "b" / "logs" / "rank0.log").read_text()
    assert spawn_ranks(1, WORKERS_MODULE, ["kill_self", str(tmp_path)], tmp_path / "c", preload=("torch",)) == 128 + 9
    assert "printed before the kill" in (tmp_path / "c" / "logs" / "rank0.log").read_text()


@pytest.mark.timeout(120)
def test_ranks_are_not_forked_from_a_launcher_that_initialised_cuda(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A child forked after the launcher initialised CUDA cannot use CUDA: such a launcher must start its ranks as
    fresh interpreters, whatever `preload` asks. torch.cuda's initialised flag (set here as CUDA would set it) is
    inherited by a forked rank and absent from a fresh one."""
    import torch

    monkeypatch.setattr(torch.cuda, "_initialized", True)
    monkeypatch.setattr(torch, "_launch_test_mark", True, raising=False)
    assert torch.cuda.is_initialized()
    code = spawn_ranks(2, WORKERS_MODULE, ["cuda_state", str(tmp_path)], tmp_path / "run", preload=("torch",),
                       env={"PYTHONPATH": str(REPO_ROOT)})
    assert code == 0, (tmp_path / "run" / "rank0.log").read_text()
    states = [json.loads((tmp_path / f"cuda_state{r}.json").read_text()) for r in range(2)]
    assert states == [{"inherited_cuda_state": False, "forked": False}] * 2


@pytest.mark.timeout(60)
def test_ranks_are_forked_from_a_launcher_without_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU path keeps its forked ranks (they inherit what the launcher imported, its mark on torch included)."""
    import torch

    monkeypatch.setattr(torch, "_launch_test_mark", True, raising=False)
    assert not torch.cuda.is_initialized()
    assert spawn_ranks(1, WORKERS_MODULE, ["cuda_state", str(tmp_path)], tmp_path / "run", preload=("torch",)) == 0
    assert json.loads((tmp_path / "cuda_state0.json").read_text()) == {"inherited_cuda_state": False, "forked": True}
