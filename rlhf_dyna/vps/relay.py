"""Moving into a replicated destination through one replica: the first stage fills one rank of every replica group
(the one that already holds the most of it), the second copies that rank's whole buffers to the other replicas.

vLLM's DP replicas all need the same TP shards. Sent directly, a replica whose shard is spread over several
training ranks receives it in pieces, and pieces that land strided (row-parallel column blocks) are unpacked on
every replica. Relayed, only the first rank of each group assembles; the others receive whole, contiguous buffers
in place, and the ranks' exchanges even out. Worth it only where it moves no more bytes than the direct plan.
"""
from __future__ import annotations

from dataclasses import replace

from .geometry import Geometry
from .layout import Layout
from .layout_types import Entry
from .plan import Plan, build_plan

RELAY_EXTRA_BYTES = 0.01  # relaying may resend what a replica held itself (e.g. its slice of a norm): at most 1% more


def replica_groups(layout: Layout) -> list[tuple[int, ...]]:
    """Ranks holding exactly the same boxes of every tensor (in the same buffers), grouped; in rank order."""
    held: dict[int, list[tuple[int, int, int]]] = {r: [] for r in layout.spec.ranks}
    for i, e in enumerate(layout.entries):
        for k, shard in enumerate(e.geometry.shards):
            for h in shard.holdings:
                for r in h.ranks:
                    held[r].append((i, k, h.slot))
    groups: dict[tuple, list[int]] = {}
    for r in sorted(held):
        groups.setdefault(tuple(sorted(held[r])), []).append(r)
    return sorted(tuple(g) for g in groups.values())


def restricted(layout: Layout, ranks: frozenset[int]) -> Layout:
    """`layout` with only `ranks` holding anything; every box must keep a holder."""
    memo: dict[int, Geometry] = {}
    entries = []
    for e in layout.entries:
        geometry = memo.get(id(e.geometry))
        if geometry is None:
            pieces = [(s.box, replace(h, ranks=kept)) for s in e.geometry.shards for h in s.holdings
                      if (kept := tuple(r for r in h.ranks if r in ranks))]
            geometry = memo[id(e.geometry)] = Geometry.from_pieces(e.geometry.shape, pieces)
        entries.append(Entry(e.tensor, geometry, e.buffers))
    return Layout(layout.spec, tuple(entries))


def relay_ranks(direct: Plan) -> tuple[frozenset[int], frozenset[int]] | None:
    """(first, second) stage destinations of a relayed `direct` plan: per replica group of its destination, the rank
    that copies the most bytes locally, and the others; None where some group has a single rank."""
    groups = replica_groups(direct.dst)
    if not groups or any(len(g) < 2 for g in groups):
        return None
    local = direct.local_bytes_by_rank()
    first = frozenset(max(g, key=lambda r: (local[r], -r)) for g in groups)
    return first, frozenset(direct.dst.spec.ranks) - first


def relay_plans(src: Layout, dst: Layout, first: frozenset[int], ranks_per_node: int) -> tuple[Plan, Plan]:
    """The two stages: `src` -> `dst` on the `first` ranks, then those ranks' buffers -> `dst` on all others."""
    filled = restricted(dst, first)
    return build_plan(src, filled, ranks_per_node), build_plan(filled, restricted(dst, frozenset(dst.spec.ranks) - first),
                                                               ranks_per_node)


def relay_pays(direct: Plan, stages: tuple[Plan, Plan]) -> bool:
    """Relay when, against the direct plan, it moves at most RELAY_EXTRA_BYTES more in all and the rank that receives
    the most receives at most that much more."""
    most_received = sum(s.pair_bytes() for s in stages).sum(axis=0).max()
    moved = sum(s.moved_bytes for s in stages)
    return bool(moved <= direct.moved_bytes * (1 + RELAY_EXTRA_BYTES)
                and most_received <= direct.pair_bytes().sum(axis=0).max() * (1 + RELAY_EXTRA_BYTES))


def chosen_relay(direct: Plan, ranks_per_node: int) -> tuple[frozenset[int], tuple[Plan, Plan]] | None:
    """The first-stage ranks and both stages of relaying `direct`, where a relay is possible and pays; else None."""
    ranks = relay_ranks(direct)
    if ranks is None:
        return None
    stages = relay_plans(direct.src, direct.dst, ranks[0], ranks_per_node)
    return (ranks[0], stages) if relay_pays(direct, stages) else None
