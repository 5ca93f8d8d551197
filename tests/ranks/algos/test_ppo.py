"""PPO's whitening on real gloo ranks: a batch split over ranks is whitened with the whole batch's statistics."""
import pytest
import torch
import torch.distributed as dist

from rlhf_dyna.algos.ppo import whiten
from tests.multirank import run_ranks


def _summed(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    dist.all_reduce(t)
    return t


def _whiten_halves(rank: int, world: int) -> None:
    torch.manual_seed(0)
    adv, mask = torch.randn(4, 5) * 3 + 1, (torch.rand(4, 5) > 0.3).float()  # the same on both ranks
    mine = slice(rank * 2, rank * 2 + 2)  # each rank holds two rows, with different token counts and stats
    assert torch.allclose(whiten(adv[mine], mask[mine], reduce=_summed), whiten(adv, mask)[mine], atol=1e-6)
    assert not torch.allclose(whiten(adv[mine], mask[mine]), whiten(adv, mask)[mine], atol=1e-3)


@pytest.mark.timeout(120)
def test_whiten_of_a_batch_split_over_ranks_uses_the_whole_batch_stats():
    run_ranks(_whiten_halves, 2)
