"""Predict the step time of each placement policy from phase-time models and the cost model (pure).

Each phase's time on n devices is modelled as t(n) = serial + parallel / n (Amdahl), fitted to phase
times measured on rank sets of 1, 2, 4 ranks (`fit_phase`). A policy's step time combines these with
the predicted seconds of its transitions (`transition_seconds`: the VPS planner + `vps.cost` on a
cluster description):

- colocate: gen(N) + prepare(N) + train_actor(N) + train_critic(N) + sync
- split (r rollout ranks, N - r training): staleness 0: gen(r) + sync + prepare(t) + train(t);
  staleness 1: generation of step k+1 overlaps training of step k, so max(gen(r), prepare(t) + train(t)) + sync
- lend (PPO): gen(N) + prepare(N) + max(train_actor(a), train_critic(N - a)) + sync + role moves
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..vps.cost import Cluster
from ..vps.dryrun import Transition, summarize
from ..vps.model import ModelCatalog
from .placement import GENERATE, PREPARE, TRAIN_ACTOR, TRAIN_CRITIC, changes, weight_sync
from .policies import PolicyRequest, make_placement


@dataclass(frozen=True)
class PhaseModel:
    """t(n) = serial_s + parallel_s / n seconds on n devices."""

    serial_s: float
    parallel_s: float

    def seconds(self, n: int) -> float:
        return self.serial_s + self.parallel_s / n


ZERO = PhaseModel(0.0, 0.0)


def fit_phase(points: dict[int, float]) -> PhaseModel:
    """Least squares fit of serial + parallel / n to {n: seconds}, both terms >= 0."""
    ns, ts = list(points), list(points.values())
    xs = [1.0 / n for n in ns]
    k = len(ns)
    mx, mt = sum(xs) / k, sum(ts) / k
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (t - mt) for x, t in zip(xs, ts)) / sxx if sxx > 0 else 0.0
    a = mt - b * mx
    if b < 0:  # slower with more ranks (e.g. ranks sharing cores): no parallel part
        return PhaseModel(mt, 0.0)
    if a < 0:  # superlinear points: all parallel
        return PhaseModel(0.0, sum(x * t for x, t in zip(xs, ts)) / sum(x * x for x in xs))
    return PhaseModel(a, b)


@dataclass(frozen=True)
class Workload:
    """Phase models of one RL step; train_critic is ZERO without a critic (GRPO)."""

    name: str
    generate: PhaseModel
    prepare: PhaseModel
    train_actor: PhaseModel
    train_critic: PhaseModel = ZERO

    @property
    def has_critic(self) -> bool:
        return self.train_critic != ZERO


@dataclass(frozen=True)
class Prediction:
    policy: str
    step_s: float
    phases_s: dict[str, float]  # seconds of each phase on the set it runs on
    transition_s: float  # weight sync + role moves, not overlapped
    sets: dict[str, int] = field(default_factory=dict)  # devices per role set
    staleness: int = 0


def colocate_step(w: Workload, n: int, transition_s: float) -> Prediction:
    phases = {GENERATE: w.generate.seconds(n), PREPARE: w.prepare.seconds(n), TRAIN_ACTOR: w.train_actor.seconds(n),
              TRAIN_CRITIC: w.train_critic.seconds(n)}
    return Prediction("colocate", sum(phases.values()) + transition_s, phases, transition_s, {"all": n})


def split_step(w: Workload, n: int, rollout: int, staleness: int, transition_s: float) -> Prediction:
    t = n - rollout
    phases = {GENERATE: w.generate.seconds(rollout), PREPARE: w.prepare.seconds(t),
              TRAIN_ACTOR: w.train_actor.seconds(t), TRAIN_CRITIC: w.train_critic.seconds(t)}
    training = phases[PREPARE] + phases[TRAIN_ACTOR] + phases[TRAIN_CRITIC]
    body = max(phases[GENERATE], training) if staleness else phases[GENERATE] + training
    return Prediction("split", body + transition_s, phases, transition_s, {"rollout": rollout, "train": t}, staleness)


def lend_step(w: Workload, n: int, actor: int, transition_s: float) -> Prediction:
    phases = {GENERATE: w.generate.seconds(n), PREPARE: w.prepare.seconds(n),
              TRAIN_ACTOR: w.train_actor.seconds(actor), TRAIN_CRITIC: w.train_critic.seconds(n - actor)}
    body = phases[GENERATE] + phases[PREPARE] + max(phases[TRAIN_ACTOR], phases[TRAIN_CRITIC])
    return Prediction("lend", body + transition_s, phases, transition_s, {"actor": actor, "critic": n - actor})


def transition_seconds(req: PolicyRequest, catalog: ModelCatalog, cluster: Cluster) -> float:
    """Predicted seconds of one step's weight sync and role moves under `req` (summed: they do not overlap)."""
    placement = make_placement(req)
    sync = weight_sync(placement)
    moves = [Transition(sync.name, sync.src, sync.dst)]
    moves += [Transition(c.name, c.src.spec, c.dst.spec) for c in changes(placement) if c.is_vps]
    return sum(row["predicted_s"] for row in summarize(catalog, moves, cluster))


TransitionCost = Callable[[PolicyRequest], float]


def predict_policies(w: Workload, base: PolicyRequest, cost: TransitionCost) -> list[Prediction]:
    """colocate, the best split for staleness 0 and 1, and the best lend (PPO), on base.world_size devices."""
    n = base.world_size
    out = [colocate_step(w, n, cost(_with(base, "colocate")))]
    rollout_sizes = [r for r in range(1, n) if r % base.rollout_tp == 0 and (n - r) % base.train.inner == 0]
    for staleness in (0, 1):
        candidates = [split_step(w, n, r, staleness, cost(_with(base, "split", rollout_ranks=r))) for r in rollout_sizes]
        if candidates:
            out.append(min(candidates, key=lambda p: p.step_s))
    if w.has_critic:
        actor_sizes = [a for a in range(1, n) if a % base.train.inner == 0 and (n - a) % base.train.inner == 0]
        candidates = [lend_step(w, n, a, cost(_with(base, "lend", train_ranks=a))) for a in actor_sizes]
        if candidates:
            out.append(min(candidates, key=lambda p: p.step_s))
    return out


def _with(base: PolicyRequest, policy: str, **kw) -> PolicyRequest:
    fields = dict(base.__dict__, policy=policy, max_staleness=0, rollout_ranks=0, train_ranks=0, explicit=())
    return PolicyRequest(**{**fields, **kw})
