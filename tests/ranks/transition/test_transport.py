"""The transport of a transition is the world's, chosen once (transition/transport.py); every buffer must live on its
device, and a group's first NCCL call is a warm-up that every member joins (logic run here on gloo ranks)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rlhf_dyna.transition.executor import execute
from rlhf_dyna.transition.transport import (
    GLOO, NCCL, ensure_warm, transport_of_backend, warm_up, wire_device, world_device_type, world_transport,
)
from rlhf_dyna.vps.rank_plan import for_rank
from rlhf_dyna.vps.spec import ParallelSpec, Phase
from tests.ranks.transition.test_executor import _transition, run_ranks


def test_transport_follows_the_world_backend() -> None:
    assert transport_of_backend("gloo") == GLOO
    assert transport_of_backend("cpu:gloo,cuda:nccl") == NCCL  # what launch.rank sets on a CUDA rank
    assert transport_of_backend("nccl") == NCCL
    assert wire_device(GLOO) == torch.device("cpu")


def test_a_buffer_off_the_transports_device_is_refused_before_anything_moves() -> None:
    """A rank whose destination sits elsewhere than the world's transport expects (the split sync's CPU buffers on an
    NCCL world) would post receives no peer matches; the executor refuses it with a sentence instead."""
    _, _, schedule, _, src, dst = _transition(0, ParallelSpec(dp=1), ParallelSpec(Phase.ROLLOUT, tp=1), 1 << 20)
    name = next(iter(dst))
    dst[name] = torch.empty(dst[name].shape, dtype=dst[name].dtype, device="meta")
    with pytest.raises(ValueError, match=rf"destination buffer {name!r} .* is on meta but this world's transport moves "
                                         r"cpu tensors"):
        execute(for_rank(schedule, 0), src, dst, transport=GLOO)


def _warm_once(rank: int, world: int) -> None:
    assert world_transport() == GLOO and world_device_type() == "cpu"
    pair = dist.new_group([0, 1])
    assert warm_up(None, torch.device("cpu")) is True  # the world's first call: every rank joins it
    assert warm_up(None, torch.device("cpu")) is False
    assert warm_up(pair, torch.device("cpu")) is True  # another group: its own first call
    assert ensure_warm(pair, GLOO) is False  # gloo needs none, and never pays for one


@pytest.mark.timeout(60)
def test_warm_up_is_the_first_call_of_each_group_once() -> None:
    run_ranks(_warm_once, 2)
