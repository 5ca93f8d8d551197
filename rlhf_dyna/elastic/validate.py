"""Refuse placements that cannot run, before any rank spawns; each error names the wrong number (pure)."""
from __future__ import annotations

from .placement import ROLLOUT, Placement, RankSet


class PlacementError(ValueError):
    pass


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_sets(world_size: int, sets: dict[str, RankSet], disjoint: tuple[tuple[str, str], ...]) -> None:
    """Every set inside [0, world_size) and non-empty; the named pairs must not share a rank."""
    for name, s in sets.items():
        if s.size < 1:
            raise PlacementError(
                f"{name} has {s.size} ranks: a role needs at least one device. With parallel.world_size="
                f"{world_size}, give each set >= 1 rank (e.g. placement.rollout_ranks / placement.train_ranks, or "
                f"+placement.roles.<role>=[first,size]).")
        if s.first < 0 or s.stop > world_size:
            raise PlacementError(
                f"{name} is ranks {s.first}..{s.stop - 1} (first={s.first}, size={s.size}) but the world has ranks "
                f"0..{world_size - 1} (parallel.world_size={world_size}); valid: first >= 0 and first + size <= "
                f"{world_size}.")
    for a, b in disjoint:
        if sets[a].overlaps(sets[b]):
            shared = sorted(set(sets[a].ranks) & set(sets[b].ranks))
            raise PlacementError(
                f"{a} {sets[a].describe()} and {b} {sets[b].describe()} share ranks {shared}, but this policy runs "
                f"them at the same time on disjoint devices; move one so that they do not overlap.")


def check_placement(placement: Placement, train_inner: int, rollout_tp: int) -> None:
    """Each resident spec covers exactly its set, rollout TP divides the rollout set, training fits its set."""
    for phase, by_role in placement.slots.items():
        for role, slot in by_role.items():
            if slot.parked:
                continue
            ranks, spec = slot.ranks, slot.spec
            if role == ROLLOUT and ranks.size % rollout_tp:
                raise PlacementError(
                    f"rollout.tp={rollout_tp} does not divide the {ranks.size} ranks of the rollout set "
                    f"{ranks.describe()} ({placement.policy}); valid rollout.tp for that set: "
                    f"{_divisors(ranks.size)}, or give the rollout a multiple of {rollout_tp} ranks.")
            if role != ROLLOUT and ranks.size % train_inner:
                raise PlacementError(
                    f"the {role} trains with tp*pp*cp={train_inner} but its set {ranks.describe()} in {phase} "
                    f"({placement.policy}) has {ranks.size} ranks, not a multiple; give it a multiple of "
                    f"{train_inner} ranks or choose tp*pp*cp among {_divisors(ranks.size)}.")
            if spec.world_size != ranks.size or spec.first_rank != ranks.first:
                raise PlacementError(
                    f"{role} in {phase}: spec {spec.describe()} spans {spec.world_size} ranks from "
                    f"{spec.first_rank} but its set is {ranks.describe()}; the spec must cover exactly its set.")
    for phase, roles in placement.active.items():
        for role in roles:
            if placement.slot(phase, role).parked:
                raise PlacementError(f"{role} computes in {phase} ({placement.policy}) but is parked in host "
                                     "memory there; a role must be resident on devices in the phases it runs in.")
