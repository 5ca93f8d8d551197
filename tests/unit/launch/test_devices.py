"""The device choices of a run and of its ranks (launch/devices.py), as pure functions of what the node shows."""
from __future__ import annotations

import pytest

from rlhf_dyna.launch import LaunchError
from rlhf_dyna.launch.devices import (
    RankDevice, engine_visible_devices, forks_ranks, rank_device, run_device, world_backend,
)


def test_a_cpu_run_never_takes_a_gpu_even_where_there_are_fewer_than_ranks() -> None:
    # parallel.device=cpu on a node with 2 GPUs and 4 local ranks: no rank may call set_device
    assert [rank_device("cpu", r, 4, gpus=2) for r in range(4)] == [RankDevice("cpu")] * 4


def test_cuda_ranks_take_the_gpu_of_their_local_rank() -> None:
    assert [rank_device("cuda", r, 4, gpus=8) for r in range(4)] == [RankDevice("cuda", r) for r in range(4)]
    assert rank_device("auto", 3, 4, gpus=4) == RankDevice("cuda", 3)
    assert str(rank_device("auto", 3, 4, gpus=4)) == "cuda:3"


def test_auto_without_gpus_is_the_cpu() -> None:
    assert rank_device("auto", 1, 2, gpus=0) == RankDevice("cpu")
    assert run_device("auto", 0) == "cpu" and run_device("auto", 1) == "cuda" and run_device("cpu", 8) == "cpu"


def test_one_visible_gpu_per_rank_is_device_zero() -> None:
    # SLURM's --gpus-per-task=1: every local rank sees exactly its own GPU
    assert rank_device("cuda", 5, 8, gpus=1) == RankDevice("cuda", 0)


def test_too_few_gpus_for_the_local_ranks_says_what_would_work() -> None:
    with pytest.raises(LaunchError, match=r"local rank 3 of 4 .* 2 GPU\(s\) are visible .* parallel.device=cpu"):
        rank_device("cuda", 3, 4, gpus=2)
    with pytest.raises(LaunchError, match="is not a device"):
        run_device("tpu", 8)


def test_backend_follows_the_device() -> None:
    assert world_backend("cpu") == "gloo"
    assert world_backend("cuda") == "cpu:gloo,cuda:nccl"


def test_ranks_are_forked_only_without_gpus_and_without_cuda_initialised() -> None:
    assert forks_ranks(gpus=0, cuda_initialised=False)
    assert not forks_ranks(gpus=1, cuda_initialised=False)
    assert not forks_ranks(gpus=0, cuda_initialised=True)


def test_engine_process_sees_only_the_ranks_gpu() -> None:
    assert engine_visible_devices(None, 3) == "3"
    assert engine_visible_devices("", 1) == "1"
    assert engine_visible_devices("4,5,6,7", 2) == "6"
    assert engine_visible_devices("GPU-aa, GPU-bb", 1) == "GPU-bb"
    with pytest.raises(LaunchError, match="not among CUDA_VISIBLE_DEVICES=4,5"):
        engine_visible_devices("4,5", 2)
