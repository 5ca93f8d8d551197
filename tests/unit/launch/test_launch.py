"""Launch refusals and /dev/shm hygiene that start no process: capacity checks, bad entries, init outside a launch,
and removing a run's segments (the launches themselves: tests/app/launch/test_launch.py)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from rlhf_dyna.launch import (
    RANKS_PER_CORE_LIMIT,
    SHM_DIR,
    LaunchError,
    check_capacity,
    clean_shm_segments,
    init_distributed,
    new_run_ident,
    run_segments,
    spawn_ranks,
    usable_cores,
)

WORKERS = str(Path(__file__).parents[2] / "app" / "launch" / "workers.py")  # never started: refused before


def test_clean_shm_segments_removes_only_this_runs() -> None:
    ours, theirs = new_run_ident(), new_run_ident()
    names = [f"{ours}-tp:0-[0-1]-cpushm_0", f"{ours}-tp:0-[0-1]-cpushm_1", f"{theirs}-tp:0-[0-1]-cpushm_0"]
    for name in names:
        (SHM_DIR / name).write_bytes(b"\0")
    extra = SHM_DIR / f"psm_{ours[-8:]}"
    extra.write_bytes(b"\0")
    try:
        assert sorted(clean_shm_segments(ours, [extra])) == sorted([*names[:2], extra.name])
        assert [p.name for p in run_segments(theirs)] == [names[2]]
        assert run_segments(ours) == []
    finally:
        clean_shm_segments(theirs)


def test_capacity_refuses_too_many_cpu_ranks() -> None:
    limit = RANKS_PER_CORE_LIMIT * usable_cores()
    check_capacity(limit, "cpu")
    with pytest.raises(LaunchError, match=rf"world_size={limit + 1} .* Use world_size <= {limit}"):
        check_capacity(limit + 1, "cpu")
    with pytest.raises(LaunchError, match="world_size=0"):
        check_capacity(0, "cpu")


def test_capacity_refuses_what_memory_cannot_hold() -> None:
    with pytest.raises(LaunchError, match=r"GiB is available; at most \d+ rank"):
        check_capacity(2, "cpu", mem_per_rank_bytes=1 << 50)


def test_capacity_refuses_more_ranks_than_gpus_and_unknown_devices() -> None:
    import torch

    gpus = torch.cuda.device_count()
    with pytest.raises(LaunchError, match=rf"{gpus} GPU\(s\) are visible"):
        check_capacity(gpus + 1, "cuda")
    with pytest.raises(LaunchError, match="device='tpu'"):
        check_capacity(1, "tpu")


def test_spawn_refuses_before_spawning(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(LaunchError):
        spawn_ranks(RANKS_PER_CORE_LIMIT * usable_cores() + 1, WORKERS, ["all_reduce", str(tmp_path)], tmp_path / "run")
    assert time.monotonic() - start < 2
    assert not (tmp_path / "run").exists()


def test_fork_refuses_a_script_entry(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="runs a module"):
        spawn_ranks(2, WORKERS, ["all_reduce", str(tmp_path)], tmp_path / "run", preload=("torch",))


def test_init_distributed_outside_a_launch_says_how(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(LaunchError, match="torchrun"):
        init_distributed()
