"""The changes of world at a step boundary, in order (placement=colocate; docs/elastic.md): the scripted events due
(`leave:R@S`: orchestrator/leave.py; `join@S`: orchestrator/join.py), then the ranks that received SIGTERM, then the
`elastic.join=RUN_DIR` processes that have asked and are prepared (rank 0 reads the store; one broadcast).

A joiner enters inside the boundary, at its own event (orchestrator/joiner.py): it then runs the rest of that
boundary from the next event on (`first`), and its first step skips the boundary it has already been through."""
from __future__ import annotations

import torch.distributed as dist

from ..elastic.join_world import is_ready, joiner_name, refuse, request, requests_so_far
from ..elastic.membership import MembershipError
from ..vps.spec import describe_ranks
from .join import admit_joiners, joined_world
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
            first_joiner = membership.joiners_before
            names = [joiner_name(k) for k in range(first_joiner, first_joiner + event.joining)]
            metrics.update(admit_joiners(runtime, membership, names, step - 1, event.name))
    asked = membership.sigterm.agree() if membership.sigterm is not None else ()
    if asked:
        metrics.update(change_world(runtime, membership, asked, f"elastic/leave/{describe_ranks(asked)}@{step - 1}"))
    requests = agreed_requests(membership) if membership.accepts_requests else []
    if requests:
        metrics.update(admit_joiners(runtime, membership, requests, step - 1,
                                     f"elastic/join/+{len(requests)}@{step - 1}", scripted=False))
    return {**metrics, "elastic/world_size": float(dist.get_world_size())}


def agreed_requests(membership: Membership) -> list[str]:
    """Collective: the elastic.join=RUN_DIR processes prepared by now that the new world can take (rank 0 reads the
    store and refuses, with a message to the process, those whose world the global batch does not split over)."""
    box: list = [[]]
    if dist.get_rank() == 0:
        store, names = membership.store, []
        for n in range(membership.requests_seen, requests_so_far(store)):  # in order: one still preparing waits
            if not is_ready(store, request(n)):
                break
            names.append(request(n))
        membership.requests_seen += len(names)
        try:
            box = [names if names and joined_world(membership, len(names)) else []]
        except MembershipError as err:
            why = f"{err} The job goes on with {dist.get_world_size()} ranks."
            print(f"rlhf_dyna: join of {', '.join(names)} refused: {why}", flush=True)
            for name in names:
                refuse(store, name, why)
    dist.broadcast_object_list(box, src=0)
    return box[0] or []
