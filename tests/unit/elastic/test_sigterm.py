"""elastic/sigterm.LeaveOnSigterm on a world of one gloo rank: a SIGTERM is answered once, at the first agreement that
starts after it, including one that arrives while the rank waits inside an agreement's all-reduce."""
from __future__ import annotations

import os
import signal

import torch.distributed as dist

from rlhf_dyna.elastic.sigterm import LeaveOnSigterm


def test_a_sigterm_during_the_agreement_is_answered_at_the_next_boundary(monkeypatch) -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        requests = LeaveOnSigterm().install()
        assert requests.agree() == ()
        os.kill(os.getpid(), signal.SIGTERM)
        assert requests.agree() == (0,)
        assert requests.agree() == ()  # answered once

        all_reduce = dist.all_reduce

        def reduce_then_signalled(tensor, *args, **kwargs):  # the signal lands while this rank waits for its peers
            all_reduce(tensor, *args, **kwargs)
            os.kill(os.getpid(), signal.SIGTERM)

        monkeypatch.setattr(dist, "all_reduce", reduce_then_signalled)
        assert requests.agree() == ()  # this agreement's flags were set before the signal
        monkeypatch.setattr(dist, "all_reduce", all_reduce)
        assert requests.agree() == (0,)  # not lost: the next boundary answers it
    finally:
        signal.signal(signal.SIGTERM, previous)
        dist.destroy_process_group()
