"""The changes of world at a step boundary, in order (placement=colocate, split or lend; docs/elastic/membership.md): the scripted events
due (`leave:R@S`: orchestrator/leave.py; `join@S`: orchestrator/join.py), then the ranks that received SIGTERM, then
the `elastic.join=RUN_DIR` processes agreed on at the start of the step before (orchestrator/next_world.py); then the
next boundary's first change is prepared (next_world: its world built in the background during the step).

A joiner enters inside the boundary, at its own event (orchestrator/joiner.py): it then runs the rest of that boundary
from the next event on (`first`), and its first step skips the boundary it has already been through."""
from __future__ import annotations

import torch.distributed as dist

from ..elastic.join_world import joiner_name
from ..vps.spec import describe_ranks
from .join import admit_joiners
from .leave import change_world
from .live_world import Membership
from .next_world import REQUESTS, admissible, prepare_next_world


def changes_before_step(runtime, membership: Membership, step: int, first: int = 0) -> dict[str, float]:
    """Every change due before `step`, one after another, from the `first` scripted event due then (the first over
    the groups built in the background during the step before, where it was known then); each change's metrics and
    elastic/world_size; then the next boundary's world prepared."""
    metrics: dict[str, float] = {}
    if membership.entered_before == step:  # a joiner: it went through this boundary while entering
        return {"elastic/world_size": float(dist.get_world_size())}
    generation = membership.generation
    for event in membership.due_before(step)[first:]:
        build = membership.take_build(event.text)
        runtime.before_change()
        membership.begin_change(leave=bool(event.leaving))
        if event.leaving:
            metrics.update(change_world(runtime, membership, event.leaving, event.name, build))
        else:
            first_joiner = membership.joiners_before
            names = [joiner_name(k) for k in range(first_joiner, first_joiner + event.joining)]
            metrics.update(admit_joiners(runtime, membership, names, step - 1, event.name, build=build))
    asked = membership.sigterm.agree() if membership.sigterm is not None else ()
    if asked:  # known only now: its world is built here
        runtime.before_change()
        membership.begin_change(leave=True)
        metrics.update(change_world(runtime, membership, asked, f"elastic/leave/{describe_ranks(asked)}@{step - 1}"))
    requests = admissible(membership, membership.agreed)
    if requests:
        runtime.before_change()
        membership.begin_change(leave=False)
        metrics.update(admit_joiners(runtime, membership, requests, step - 1,
                                     f"elastic/join/+{len(requests)}@{step - 1}", scripted=False,
                                     build=membership.take_build(REQUESTS)))
    membership.end_changes(generation)
    prepare_next_world(runtime, membership, step)
    return {**metrics, "elastic/world_size": float(dist.get_world_size())}
