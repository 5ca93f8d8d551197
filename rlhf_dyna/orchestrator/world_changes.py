"""The changes of world at a step boundary, in order (placement=colocate; docs/elastic.md): the scripted events due
(`leave:R@S`: orchestrator/leave.py; `join@S`: orchestrator/join.py), then the ranks that received SIGTERM.

A joiner enters inside the boundary, at its own event (orchestrator/joiner.py): it then runs the rest of that
boundary from the next event on (`first`), and its first step skips the boundary it has already been through."""
from __future__ import annotations

import torch.distributed as dist

from ..vps.spec import describe_ranks
from .join import admit_joiners
from .leave import change_world
from .live_world import Membership


def changes_before_step(runtime, membership: Membership, step: int, first: int = 0) -> dict[str, float]:
    """Every change due before `step`, one after another, from the `first` scripted event due then; each change's
    metrics and elastic/world_size."""
    metrics: dict[str, float] = {}
    if membership.entered_before == step:  # a joiner: it went through this boundary while entering
        return {"elastic/world_size": float(dist.get_world_size())}
    for event in membership.due_before(step)[first:]:
        if event.leaving:
            metrics.update(change_world(runtime, membership, event.leaving, event.name))
        else:
            metrics.update(admit_joiners(runtime, membership, event.joining, step - 1, event.name))
    asked = membership.sigterm.agree() if membership.sigterm is not None else ()
    if asked:
        metrics.update(change_world(runtime, membership, asked, f"elastic/leave/{describe_ranks(asked)}@{step - 1}"))
    return {**metrics, "elastic/world_size": float(dist.get_world_size())}
