"""The next boundary's world, known at the start of the step before it and built in the background during that step
(placement=colocate, split or lend; docs/elastic/background_world.md).

At the start of step S (after the changes of its boundary), on every rank of the world:
1. elastic.join=RUN_DIR processes prepared by now are agreed on for the boundary after S (rank 0 reads the store, one
   broadcast), unless a scripted event is due there (they then wait a step: the world they join is not known yet);
2. the first change due at the boundary after S is planned where it is known now: its first scripted event
   (elastic.events: known from the start), else the agreed requests;
3. on gloo, every process of that new world starts building its groups on a thread (elastic.world_prebuild): the
   ranks that stay, and the joiners, whose plan rank 0 posts on the job's store (they build while they wait).
At the boundary the change enters the new world over those groups. What is not known a step ahead is built at its
boundary (`elastic/<leave|join>/background` 0): a SIGTERM leave, a change after the first of a boundary, a request
joining where a SIGTERM leave came first at its boundary; and every world on NCCL (elastic/world_builder.py says why).
"""
from __future__ import annotations

import torch.distributed as dist

from ..elastic.events import Event
from ..elastic.join_world import fate, is_ready, joiner_name, post_plan, refuse, request, requests_so_far
from ..elastic.membership import MembershipError
from ..elastic.world_builder import builds_in_background
from ..elastic.world_prebuild import WorldBuild, WorldPlan, mesh_groups, plan_payload
from ..parallel_layout import ParallelLayout
from ..transition.transport import world_transport
from .join import drop_if_dead, joined_world
from .leave import left_world, preplan_moves, trained_layout
from .live_world import Membership

REQUESTS = "requests"  # Membership.build_for of a build for the agreed elastic.join requests


def prepare_next_world(runtime, membership: Membership, step: int) -> None:
    """Collective over the world, at the start of `step`: agree on the requests the boundary after it admits, and
    start building the world of that boundary's first change where it is known now."""
    membership.drop_build()
    membership.agreed = []
    if step >= runtime.cfg.trainer.total_steps:  # no boundary follows the last step
        return
    due = membership.due_before(step + 1)
    if not due and membership.accepts_requests:
        membership.agreed = agreed_requests(membership)
    first = next_change(runtime, membership, due[0] if due else None)
    if first is not None and due and due[0].leaving:
        preplan_moves(runtime, left_world(membership, due[0].leaving))
    if first is None or not builds_in_background(world_transport()):
        return
    new_rank, size, layouts, joiners = first
    plan = WorldPlan(membership.generation + 1, size, mesh_groups(layouts, size), step)
    if dist.get_rank() == 0:
        for i, name in enumerate(joiners):
            post_plan(membership.store, name, plan_payload(plan, dist.get_world_size() + i))
    if new_rank is not None:
        membership.build = WorldBuild(plan, new_rank).start()
        membership.build_for = due[0].text if due else REQUESTS


def next_change(runtime, membership: Membership,
                event: Event | None) -> tuple[int | None, int, list[ParallelLayout], list[str]] | None:
    """The first change of the next boundary where it is known now (`event`: its first scripted one; else the agreed
    requests): (this rank's number in the new world or None where it leaves, the new world's size, the layouts whose
    meshes the change builds there, the joiners' names); None: no change known, or one the boundary will refuse."""
    rank = dist.get_rank()
    try:
        if event is not None and event.leaving:
            new = left_world(membership, event.leaving)
            size = new.change.new_world_size
            return new.change.renumbering().get(rank), size, [trained_layout(new)], []
        if event is not None:
            first = membership.joiners_before
            joiners = [joiner_name(k) for k in range(first, first + event.joining)]
        else:
            joiners = list(membership.agreed)
        if not joiners:
            return None
        new = joined_world(membership, len(joiners))
        size = new.change.new_world_size
        return rank, size, [trained_layout(new)], joiners
    except MembershipError:
        return None


def agreed_requests(membership: Membership) -> list[str]:
    """Collective: the elastic.join=RUN_DIR processes prepared by now that the world, one rank larger each, can take
    (rank 0 reads the store and refuses, with a message to the process, those whose world the global batch does not
    split over); every rank counts the requests seen (any rank may be rank 0 later)."""
    box: list = [[[], membership.requests_seen]]
    if dist.get_rank() == 0:
        store, names = membership.store, []
        seen = membership.requests_seen
        for n in range(membership.requests_seen, requests_so_far(store)):  # in order: one still preparing waits
            drop_if_dead(store, request(n))
            if fate(store, request(n)) is not None:  # dead first (the launcher saw it), or claimed in a lost world
                seen = n + 1
                continue
            if not is_ready(store, request(n)):
                break
            names.append(request(n))
            seen = n + 1
        try:
            agreed = names if names and joined_world(membership, len(names)) else []
            box = [[agreed, seen]]
        except MembershipError as err:
            why = f"{err} The job goes on with {dist.get_world_size()} ranks."
            print(f"rlhf_dyna: join of {', '.join(names)} refused: {why}", flush=True)
            for name in names:
                refuse(store, name, why)
            box = [[[], seen]]
    dist.broadcast_object_list(box, src=0)
    names, membership.requests_seen = box[0]
    return names


def admissible(membership: Membership, names: list[str]) -> list[str]:
    """Collective-free, the same on every rank: the agreed requests if the world still takes them at their boundary
    (a SIGTERM leave may have come first), else [] (rank 0 tells the processes why)."""
    if not names:
        return []
    try:
        joined_world(membership, len(names))
        return names
    except MembershipError as err:
        if dist.get_rank() == 0:
            why = f"{err} The job goes on with {dist.get_world_size()} ranks."
            print(f"rlhf_dyna: join of {', '.join(names)} refused: {why}", flush=True)
            for name in names:
                refuse(membership.store, name, why)
        return []
