"""Membership changes as data (pure): ranks leave or join a world at a step boundary; the survivors' new numbers, the
layout and placement of the new world, and every role's state move from the old world into it.

    change = WorldChange(world_size=4, leaving=(1,))        # rank 1 of 4 leaves
    change.new_ranks                                         # (0, 2, 3): new rank i is rank new_ranks[i] of the old
    new = world_after(placement, ParallelLayout(tp=1), rollout_tp=1, batch=GlobalBatch(16, 128, 1), change=change)
    new.placement, new.layout                                # the policy's slots over 3 ranks, dp 4 -> 3
    new.moves                                                # per training role: old spec -> new spec, in rank space

Rank space: a change is planned over the old world's ranks followed by the joining ones (world_size, world_size + 1,
...), since the leaving ranks send their state before they exit and the joining ones receive. Survivors keep their
order (new rank i is the i-th survivor) and joiners come after them, so a role's contiguous rank set stays contiguous
in the new numbering; joiners extend the sets that reached the end of the old world. Where the survivors are not
consecutive in the old numbering, the destination specs carry a rank map (vps.spec.placed_on).

The new layout follows the placement rules: dp changes first (the layout's dp fills each new set); tp, pp, cp and ep
drop to a divisor of their value only where the new set sizes require it. The global batch stays the same: a new dp
that the step's rows do not split over is refused, as is a change that empties a role (every non-empty set fits
some layout: tp = pp = cp = ep = 1 fills any size).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product

from ..parallel_layout import LayoutError, ParallelLayout, divisors
from ..vps.spec import ParallelSpec, describe_ranks, placed_on
from ..vps.tensor import Kind
from .placement import (ACTOR, CRITIC, PREPARE, REFERENCE, REWARD_MODEL, ROLLOUT, TRAIN_ACTOR, TRAIN_CRITIC, Placement,
                        RankSet, RoleSlot, resident)
from .policies import lend_sets, rollout_spec_on, train_spec_on
from .validate import PlacementError, check_placement

TRAINED_IN = {ACTOR: TRAIN_ACTOR, CRITIC: TRAIN_CRITIC}  # the phase whose set shards a role's rows over its dp


class MembershipError(ValueError):
    """A change of world that cannot happen: the message names the numbers and what would be valid."""


@dataclass(frozen=True)
class WorldChange:
    """`leaving` ranks of a world of `world_size` leave and `joining` new ranks join, at one step boundary."""

    world_size: int
    leaving: tuple[int, ...] = ()
    joining: int = 0

    def __post_init__(self) -> None:
        world = self.world_size
        outside = sorted(r for r in self.leaving if not 0 <= r < world)
        if outside:
            raise MembershipError(f"rank(s) {outside} cannot leave: the world has {world} ranks, 0..{world - 1}.")
        if len(set(self.leaving)) != len(self.leaving):
            raise MembershipError(f"leaving ranks {list(self.leaving)} name a rank twice; name each rank once.")
        if self.joining < 0 or not (self.leaving or self.joining):
            raise MembershipError(f"a change needs ranks leaving or at least one joining (joining={self.joining}).")
        if self.new_world_size < 1:
            raise MembershipError(f"all {world} ranks would leave, and no rank joins: a world needs at least one rank.")

    @property
    def kind(self) -> str:
        return "leave" if not self.joining else "join" if not self.leaving else "leave+join"

    @property
    def rank_space(self) -> int:
        """Ranks the change's plans span: the old world, then the joiners."""
        return self.world_size + self.joining

    @property
    def survivors(self) -> tuple[int, ...]:
        gone = set(self.leaving)
        return tuple(r for r in range(self.world_size) if r not in gone)

    @property
    def new_ranks(self) -> tuple[int, ...]:
        """new rank -> its rank in the change's rank space: the survivors in order, then the joiners."""
        return self.survivors + tuple(range(self.world_size, self.rank_space))

    @property
    def new_world_size(self) -> int:
        return self.world_size - len(self.leaving) + self.joining

    def renumbering(self) -> dict[int, int]:
        """Old rank -> new rank of every survivor."""
        return {old: new for new, old in enumerate(self.survivors)}

    def set_after(self, ranks: RankSet) -> RankSet:
        """A contiguous set's survivors in the new numbering (contiguous again), plus the joiners where the set reached
        the end of the old world."""
        gone = set(self.leaving)
        first = sum(1 for r in range(ranks.first) if r not in gone)
        kept = sum(1 for r in ranks.ranks if r not in gone)
        return RankSet(first, kept + (self.joining if ranks.stop == self.world_size else 0))

    def describe(self) -> str:
        parts = []
        if self.leaving:
            parts.append(f"rank{'s' if len(self.leaving) > 1 else ''} {describe_ranks(sorted(self.leaving))} leave"
                         f"{'s' if len(self.leaving) == 1 else ''}")
        if self.joining:
            parts.append(f"{self.joining} rank{'s' if self.joining > 1 else ''} join{'s' if self.joining == 1 else ''}")
        return f"{' and '.join(parts)} ({self.world_size} -> {self.new_world_size} ranks)"


@dataclass(frozen=True)
class GlobalBatch:
    """The step's batch, the same in every world: prompts, rows (prompts x samples), optimizer steps per pass."""

    prompts: int
    rows: int
    mini_batches: int = 1


@dataclass(frozen=True)
class RoleMove:
    """One role's state across a change, both specs in the change's rank space."""

    role: str
    src: ParallelSpec
    dst: ParallelSpec
    kinds: tuple[Kind, ...]


@dataclass(frozen=True)
class NewWorld:
    """The world after `change`: its placement (new numbering), training layout and rollout tp, and the moves."""

    change: WorldChange
    placement: Placement
    layout: ParallelLayout  # dp=-1: it fills each training set of the placement
    rollout_tp: int
    moves: tuple[RoleMove, ...]


def layout_candidates(layout: ParallelLayout) -> list[ParallelLayout]:
    """`layout` with dp filling its set, then with tp, pp, cp, ep lowered to divisors of their values: the fewest
    dimensions changed first, then the most model parallelism (each dimension's divisors keep the model's fit)."""
    out = []
    for tp, pp, cp, ep in product(divisors(layout.tp), divisors(layout.pp), divisors(layout.cp), divisors(layout.ep)):
        changed = (tp != layout.tp) + (pp != layout.pp) + (cp != layout.cp) + (ep != layout.ep)
        out.append((changed, -tp * pp * cp, -tp, -pp, -ep, replace(layout, dp=-1, tp=tp, pp=pp, cp=cp, ep=ep)))
    return [c[-1] for c in sorted(out, key=lambda c: c[:-1])]


def layout_for(layout: ParallelLayout, sizes: list[int]) -> ParallelLayout:
    """The first candidate layout that fills every training set size in `sizes` (all >= 1). There always is one:
    tp = pp = cp = ep = 1 fills any size, so a change is refused for an emptied set or the batch, not for the layout."""
    for candidate in layout_candidates(layout):
        try:
            for size in sizes:
                candidate.fill(size)
        except LayoutError:
            continue
        return candidate
    raise AssertionError(f"tp = pp = cp = ep = 1 fills any set, yet none of {sizes} took a layout")


def rollout_tp_for(tp: int, sizes: list[int]) -> int:
    """The largest divisor of rollout tp that divides every rollout set size (1 always does)."""
    return next(t for t in sorted(divisors(tp), reverse=True) if all(s % t == 0 for s in sizes))


def relent_sets(placement: Placement, change: WorldChange, what: str) -> dict[tuple[str, str], RankSet]:
    """lend's training sets re-planned over the new world by the actor's share ({} for other policies, and for sets
    placement.roles gave, which map to their survivors); refuses a world too small for both."""
    share, size = placement.actor_share, change.new_world_size
    if placement.policy != "lend" or share is None:
        return {}
    actor, critic = lend_sets(size, share)
    if actor.size < 1 or critic.size < 1:
        asked = f"placement.train_ranks={share}" if share else "placement.train_ranks=0: half of the world"
        raise MembershipError(
            f"{what}: placement=lend trains the actor and the critic at once on two disjoint sets of the world (the "
            f"actor's: {asked}), and a world of {size} rank{'s' if size != 1 else ''} has no room for both. Keep at "
            f"least {max(2, share + 1)} ranks{' (or lower placement.train_ranks)' if share > 1 else ''}, or use "
            f"placement=colocate.")
    return {(phase, role): ranks for phase in (TRAIN_ACTOR, TRAIN_CRITIC)
            for role, ranks in ((ACTOR, actor), (CRITIC, critic))}


def mapped_slots(placement: Placement, change: WorldChange, what: str) -> dict[str, dict[str, RankSet | None]]:
    """phase -> role -> the role's set after the change (None: parked); refuses a set the change empties."""
    out: dict[str, dict[str, RankSet | None]] = {}
    relent = relent_sets(placement, change, what)
    for phase, by_role in placement.slots.items():
        out[phase] = {}
        for role, slot in by_role.items():
            if slot.parked:
                out[phase][role] = None
                continue
            after = relent.get((phase, role)) or change.set_after(slot.ranks)  # type: ignore[arg-type]
            if after.size < 1:
                raise MembershipError(
                    f"{what} empties the {role}'s set {slot.ranks.describe()} in {phase} "  # type: ignore[union-attr]
                    f"(placement={placement.policy}): every role needs at least one rank. Keep a rank of that set, "
                    f"or let ranks join first.")
            out[phase][role] = after
    return out


def smallest_prompts(batch: GlobalBatch, dp: int, replicas: int) -> int:
    """The smallest multiple of the prompts per step whose rows split over mini_batches x dp and whose prompts split
    over the rollout replicas (a multiple keeps every world the current count fits)."""
    k = 1
    while (k * batch.rows) % (batch.mini_batches * dp) or (k * batch.prompts) % replicas:
        k += 1
    return k * batch.prompts


def check_batch(new: Placement, layout: ParallelLayout, rollout_tp: int, batch: GlobalBatch, what: str) -> None:
    """The same global batch in the new world: rows over each trained role's dp, prompts over the rollout replicas."""
    rollout = new.slot(new.phases[0], ROLLOUT).ranks
    replicas = rollout.size // rollout_tp if rollout is not None else 1
    for role, phase in (*TRAINED_IN.items(), (ACTOR, PREPARE)):  # lend prepares on every rank, trains on a set
        if role not in new.roles or phase not in new.slots or new.slot(phase, role).parked:
            continue
        ranks = new.slot(phase, role).ranks
        dp = ranks.size // layout.inner  # type: ignore[union-attr]
        if batch.rows % (batch.mini_batches * dp):
            raise MembershipError(
                f"{what}: the {role} would {'prepare' if phase == PREPARE else 'train'} with dp={dp} ({ranks.size} "
                f"ranks / tp*pp*cp={layout.inner}), but the "
                f"{batch.rows} rows per step (task.prompts_per_step={batch.prompts} x rollout.n="
                f"{batch.rows // batch.prompts}) do not split into algorithm.mini_batches={batch.mini_batches} x "
                f"dp={dp} equal shards. The global batch stays the same across a change; use e.g. "
                f"task.prompts_per_step={smallest_prompts(batch, dp, replicas)}.")
    if batch.prompts % replicas:
        dp = max(1, new.slot(TRAIN_ACTOR, ACTOR).ranks.size // layout.inner)  # type: ignore[union-attr]
        raise MembershipError(
            f"{what}: the rollout would have {replicas} replicas ({rollout.size} ranks / rollout.tp={rollout_tp}), "
            f"which task.prompts_per_step={batch.prompts} does not split over. The global batch stays the same across "
            f"a change; use e.g. task.prompts_per_step={smallest_prompts(batch, dp, replicas)}.")


def world_after(placement: Placement, layout: ParallelLayout, rollout_tp: int, batch: GlobalBatch,
                change: WorldChange) -> NewWorld:
    """The new world of `change` from the current `placement` (its training `layout`, dp unresolved, and rollout tp)."""
    if change.world_size != placement.world_size:
        raise ValueError(f"the change is of a world of {change.world_size} ranks, the placement of "
                         f"{placement.world_size}")
    what = change.describe()
    sets = mapped_slots(placement, change, what)
    train_sizes = sorted({s.size for by_role in sets.values() for role, s in by_role.items() if s and role != ROLLOUT})
    roll_sizes = sorted({s.size for by_role in sets.values() for role, s in by_role.items() if s and role == ROLLOUT})
    new_layout = layout_for(layout, train_sizes)
    new_tp = rollout_tp_for(rollout_tp, roll_sizes)

    def slot(role: str, ranks: RankSet | None) -> RoleSlot:
        if ranks is None:
            return RoleSlot(None, None)
        spec = rollout_spec_on(ranks, new_tp) if role == ROLLOUT else train_spec_on(ranks, new_layout)
        return resident(ranks, spec)

    slots = {phase: {role: slot(role, s) for role, s in by_role.items()} for phase, by_role in sets.items()}
    new = replace(placement, world_size=change.new_world_size, slots=slots)
    try:
        check_placement(new, new_layout.inner, new_tp)
    except PlacementError as err:
        raise MembershipError(f"{what}: {err}") from err
    check_batch(new, new_layout, new_tp, batch, what)
    return NewWorld(change, new, new_layout, new_tp, role_moves(placement, new, change))


def role_moves(old: Placement, new: Placement, change: WorldChange) -> tuple[RoleMove, ...]:
    """Each training role's state at the step boundary (its slot in the first phase), old world -> new world, in the
    change's rank space. The rollout holds no state of its own: it is re-formed and synced from the actor."""
    boundary, out = old.phases[0], []
    for role in old.roles:
        src, dst = old.slot(boundary, role), new.slot(boundary, role)
        if role == ROLLOUT or src.parked or dst.parked:
            continue
        spec: ParallelSpec = dst.spec  # type: ignore[assignment]
        in_space = placed_on(spec, [change.new_ranks[r] for r in spec.ranks])
        kinds = (Kind.PARAM,) if role in (REFERENCE, REWARD_MODEL) else spec.kinds  # frozen: parameters only
        out.append(RoleMove(role, src.spec, in_space, kinds))  # type: ignore[arg-type]
    return tuple(out)


def live_refusal(change: WorldChange, store_rank: int | None = None) -> str | None:
    """Why a change the planner accepts cannot run live yet, or None: the rank that serves the job's store leaving
    (`store_rank`: launch.host.store_host_rank; None where a launcher serves it)."""
    if store_rank is not None and store_rank in change.leaving:
        return (f"{change.describe()}: rank {store_rank} serves the job's store (env:// rendezvous under a launcher "
                f"without an agent store), so it cannot leave; any other rank can (python -m rlhf_dyna's launcher and "
                f"torchrun's agent serve the store themselves).")
    return None


def engines_kept(change: WorldChange, rollout_tp: int, new_rollout_tp: int) -> bool:
    """Whether every rank's vLLM engine (of `rollout_tp`) goes on in the new world, re-formed: its tp stays, every
    survivor keeps its place in its TP group (an engine holds its tp shard), and joiners, whose engines start as
    replicas of their own (tp 1), join only where tp is 1. Otherwise every rank starts a new engine there."""
    if new_rollout_tp != rollout_tp or (change.joining and rollout_tp != 1):
        return False
    return all(new % rollout_tp == old % rollout_tp for new, old in enumerate(change.survivors))
