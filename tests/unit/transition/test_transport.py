"""The transport of a transition is the world's, chosen once (transition/transport.py), and every buffer must live on
its device (a group's warm-up on gloo ranks: tests/ranks/transition/test_transport.py)."""
from __future__ import annotations

import pytest
import torch

from rlhf_dyna.transition.executor import execute
from rlhf_dyna.transition.transport import GLOO, NCCL, transport_of_backend, wire_device
from rlhf_dyna.vps.rank_plan import for_rank
from rlhf_dyna.vps.spec import ParallelSpec, Phase
from tests.seeded_transition import seeded_transition


def test_transport_follows_the_world_backend() -> None:
    assert transport_of_backend("gloo") == GLOO
    assert transport_of_backend("cpu:gloo,cuda:nccl") == NCCL  # what launch.rank sets on a CUDA rank
    assert transport_of_backend("nccl") == NCCL
    assert wire_device(GLOO) == torch.device("cpu")


def test_a_buffer_off_the_transports_device_is_refused_before_anything_moves() -> None:
    """A rank whose destination sits elsewhere than the world's transport expects (the split sync's CPU buffers on an
    NCCL world) would post receives no peer matches; the executor refuses it with a sentence instead."""
    _, _, schedule, _, src, dst = seeded_transition(0, ParallelSpec(dp=1), ParallelSpec(Phase.ROLLOUT, tp=1), 1 << 20)
    name = next(iter(dst))
    dst[name] = torch.empty(dst[name].shape, dtype=dst[name].dtype, device="meta")
    with pytest.raises(ValueError, match=rf"destination buffer {name!r} .* is on meta but this world's transport moves "
                                         r"cpu tensors"):
        execute(for_rank(schedule, 0), src, dst, transport=GLOO)
