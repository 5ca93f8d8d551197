"""A group's first NCCL call is a warm-up that every member joins (logic run here on gloo ranks; the transport's choice
and its device check: tests/unit/transition/test_transport.py)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rlhf_dyna.transition.transport import GLOO, ensure_warm, warm_up, world_device_type, world_transport
from tests.multirank import run_ranks


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
