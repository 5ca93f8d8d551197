"""Automatic re-balancing of placement=split (pure): from the phase times measured so far, move devices between the
rollout set and the train set when the predicted saving over the remaining steps pays for the move.

    shape = SplitShape(world_size=4, prompts_per_step=12, rows=24, mini_batches=2)
    valid, invalid = split_candidates(shape)                      # rollout sizes; {size: why not}
    manager = Rebalancer(shape.world_size, valid, start=3, staleness=0, rule=RebalanceRule(margin=0.1, every=2))
    manager.observe(StepTimes(rollout_ranks=3, generate_s=0.4, train_s=1.6, sync_s=0.05, step_s=2.1))  # every step
    decision = manager.decide(remaining=8, move_cost=lambda target: 0.3)    # keep, or move to decision.target
    manager.apply(decision)

The step time of a split is `elastic.simulate.split_step` with phase models t(n) = serial + parallel / n: fitted
(`simulate.fit_phase`) to the mean seconds measured on each set size seen so far; a size measured once so far is
all parallel (t(n) = t(m) * m / n); a size that was measured is predicted by its measurement.

Hysteresis: a move is taken only when (gain per step - margin x current step) x remaining steps > the move's
predicted cost, after `every` steps measured on the current split. Never oscillating: a split that was left is not
entered again, except one return to the split just left (when its measured step beats the current one by the same
rule); after that return the manager settles and keeps the split for the rest of the run.

A move's predicted seconds (`move_seconds`): the state's planned bytes at the measured bandwidth, plus, when ranks
join the rollout set, an engine start and a weight sync into it.

A change of world (ranks leave or join, docs/elastic/placements.md) re-plans the manager over the new world (`over`): its
candidates are the new world's splits, it starts on the split the change mapped the sets to, and the hysteresis
begins anew (the splits left were the old world's); the phase times measured so far carry over by set size (a set of
n ranks generates or trains the step's fixed batch as fast in any world), so the first decision there is informed.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .simulate import ZERO, PhaseModel, Workload, fit_phase, split_step


@dataclass(frozen=True)
class SplitShape:
    """What decides whether a split of the world into rollout + train ranks can run a step."""

    world_size: int
    prompts_per_step: int
    rows: int  # prompts x samples per prompt: the step's training rows
    mini_batches: int
    rollout_tp: int = 1
    train_inner: int = 1  # tp * pp * cp of the training layout: dp = train ranks / train_inner


def split_candidates(shape: SplitShape) -> tuple[list[int], dict[int, str]]:
    """Rollout set sizes r (train set = world - r) that can run this config, and why each other size cannot."""
    valid, invalid = [], {}
    for r in range(1, shape.world_size):
        t = shape.world_size - r
        if r % shape.rollout_tp:
            invalid[r] = f"rollout.tp={shape.rollout_tp} does not divide {r} rollout ranks"
        elif shape.prompts_per_step % (r // shape.rollout_tp):
            invalid[r] = (f"task.prompts_per_step={shape.prompts_per_step} does not divide over "
                          f"{r // shape.rollout_tp} rollout replicas")
        elif t % shape.train_inner:
            invalid[r] = f"the training tp*pp*cp={shape.train_inner} does not divide {t} train ranks"
        elif shape.rows % (shape.mini_batches * (t // shape.train_inner)):
            invalid[r] = (f"{shape.rows} rows do not split into algorithm.mini_batches={shape.mini_batches} x "
                          f"dp={t // shape.train_inner}")
        else:
            valid.append(r)
    return valid, invalid


def describe_invalid(invalid: dict[int, str], world_size: int, rollout_tp: int = 1) -> str:
    """Each invalid split and why; the sizes rollout.tp does not divide are counted, not listed (at cluster scale
    they are most of them)."""
    listed = [f"{r}+{world_size - r}: {why}" for r, why in sorted(invalid.items()) if r % rollout_tp == 0]
    unaligned = sum(1 for r in invalid if r % rollout_tp)
    if unaligned:
        listed.insert(0, f"the {unaligned} rollout set sizes that are not a multiple of rollout.tp={rollout_tp}")
    return "; ".join(listed)


@dataclass(frozen=True)
class StepTimes:
    """One step's measured seconds on the split it ran on (train_s: prepare + train of the actor)."""

    rollout_ranks: int
    generate_s: float
    train_s: float
    sync_s: float
    step_s: float  # the whole step (the move, if any, not included)


@dataclass(frozen=True)
class RebalanceRule:
    margin: float = 0.1  # the predicted saving must exceed this fraction of the current step (noise guard)
    every: int = 2  # steps measured on a split before the next decision


@dataclass(frozen=True)
class Decision:
    current: int  # rollout ranks now
    target: int  # rollout ranks after the decision (== current: keep)
    predicted_step_s: dict[int, float] = field(default_factory=dict)  # per candidate rollout size
    predicted_gain_s: float = 0.0  # per step, target vs current
    predicted_cost_s: float = 0.0  # of the move
    remaining: int = 0
    reason: str = ""

    @property
    def moves(self) -> bool:
        return self.target != self.current

    @property
    def predicted_total_gain_s(self) -> float:
        return self.predicted_gain_s * self.remaining

    def describe(self, world_size: int) -> str:
        if not self.moves:
            return f"keep {self.current}+{world_size - self.current}: {self.reason}"
        return (f"{self.current}+{world_size - self.current} -> {self.target}+{world_size - self.target} (rollout + "
                f"train ranks): predicted gain {self.predicted_gain_s:.3f} s/step x {self.remaining} steps = "
                f"{self.predicted_total_gain_s:.3f} s vs predicted move cost {self.predicted_cost_s:.3f} s")


def move_seconds(moved_bytes: int, bytes_per_s: float, joins: bool, engine_start_s: float, sync_s: float) -> float:
    """Predicted seconds of a move: `moved_bytes` (the VPS plans' bytes between ranks) at `bytes_per_s`, plus an
    engine start and a weight sync into it when ranks join the rollout set (`joins`)."""
    return moved_bytes / max(bytes_per_s, 1.0) + (engine_start_s + sync_s if joins else 0.0)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _phase_model(points: dict[int, float]) -> PhaseModel:
    if len(points) == 1:  # one size seen: assume the phase is all parallel
        (n, seconds), = points.items()
        return PhaseModel(0.0, seconds * n)
    return fit_phase(points)


class Rebalancer:
    """The decision state of one run: what was measured on which split, the splits left, whether it settled."""

    def __init__(self, world_size: int, candidates: list[int], start: int, staleness: int = 0,
                 rule: RebalanceRule = RebalanceRule()) -> None:
        if start not in candidates:
            raise ValueError(f"rebalance: the starting split {start}+{world_size - start} is not among the valid "
                             f"rollout sizes {candidates}")
        self.world_size, self.candidates, self.staleness, self.rule = world_size, list(candidates), staleness, rule
        self.settled = False
        self._stints: list[tuple[int, list[StepTimes]]] = [(start, [])]  # (rollout size, steps measured there)
        # phase seconds measured in earlier worlds: generate by rollout set size, train by train set size, syncs
        self._earlier: tuple[dict[int, list[float]], dict[int, list[float]], list[float]] = ({}, {}, [])

    @property
    def current(self) -> int:
        return self._stints[-1][0]

    @property
    def left(self) -> list[int]:
        """Splits departed from, in order."""
        return [size for size, _ in self._stints[:-1]]

    def observe(self, times: StepTimes) -> None:
        if times.rollout_ranks != self.current:
            raise ValueError(f"rebalance: step measured on {times.rollout_ranks} rollout ranks, but the split is "
                             f"{self.current}")
        self._stints[-1][1].append(times)

    @property
    def steps_here(self) -> int:
        return len(self._stints[-1][1])

    def _measured(self) -> dict[int, list[StepTimes]]:
        """Steps per rollout size; the first step of a stint is left out when the stint has more (its warm-up)."""
        out: dict[int, list[StepTimes]] = {}
        for size, steps in self._stints:
            out.setdefault(size, []).extend(steps[1:] if len(steps) > 1 else steps)
        return {size: steps for size, steps in out.items() if steps}

    def _phase_points(self) -> tuple[dict[int, list[float]], dict[int, list[float]], list[float]]:
        """Every phase time measured so far, this world's and the earlier ones': generate seconds by rollout set size,
        train seconds by train set size, sync seconds."""
        gen = {r: list(v) for r, v in self._earlier[0].items()}
        train = {t: list(v) for t, v in self._earlier[1].items()}
        sync = list(self._earlier[2])
        for r, steps in self._measured().items():
            gen.setdefault(r, []).extend(s.generate_s for s in steps)
            train.setdefault(self.world_size - r, []).extend(s.train_s for s in steps)
            sync.extend(s.sync_s for s in steps)
        return gen, train, sync

    def over(self, world_size: int, candidates: list[int], start: int) -> Rebalancer:
        """This manager re-planned over a new world of `world_size` ranks (a change of world): its `candidates`,
        starting on `start` rollout ranks, nothing left or settled there, the phase times measured so far kept."""
        new = Rebalancer(world_size, candidates, start, self.staleness, self.rule)
        new._earlier = self._phase_points()
        return new

    def predictions(self) -> dict[int, float]:
        """Predicted step seconds of every candidate split from what was measured so far (in earlier worlds too)."""
        points, n = self._phase_points(), self.world_size
        gen, train = ({size: _mean(v) for size, v in phase.items()} for phase in points[:2])
        sync = _mean(points[2])
        gen_model, train_model = _phase_model(gen), _phase_model(train)
        out = {}
        for r in self.candidates:
            g = gen.get(r, gen_model.seconds(r))  # measured where measured, modelled elsewhere
            t = train.get(n - r, train_model.seconds(n - r))
            out[r] = split_step(Workload("measured", PhaseModel(g, 0.0), ZERO, PhaseModel(t, 0.0)), n, r,
                                self.staleness, sync).step_s
        return out

    def decide(self, remaining: int, move_cost: Callable[[int], float]) -> Decision:
        """Keep, or move to the split whose predicted net saving over `remaining` steps is the largest positive.
        `move_cost(target)`: predicted seconds of moving from the current split to `target`."""
        keep = dict(current=self.current, target=self.current, remaining=remaining)
        if self.settled:
            return Decision(**keep, reason="settled after a return to the split it had left")
        if self.steps_here < self.rule.every:
            return Decision(**keep, reason=f"{self.steps_here} of {self.rule.every} steps measured on this split")
        if remaining <= 0:
            return Decision(**keep, reason="no steps left")
        predicted = self.predictions()
        now = predicted[self.current]
        previous = self.left[-1] if self.left else None
        best: Decision | None = None
        best_net = 0.0
        for r in self.candidates:
            if r == self.current or (r in self.left and r != previous):
                continue  # never re-enter a split left earlier than the last move
            gain, cost = now - predicted[r], move_cost(r)
            net = (gain - self.rule.margin * now) * remaining - cost
            if net > best_net:
                best_net = net
                best = Decision(self.current, r, predicted, gain, cost, remaining,
                                reason="return to the split just left" if r == previous else "predicted faster")
        if best is None:
            return Decision(**keep, predicted_step_s=predicted,
                            reason=f"no split saves more than its move costs plus {self.rule.margin:.0%} of the step")
        return best

    def apply(self, decision: Decision) -> None:
        if not decision.moves:
            return
        left = self.left
        self.settled = bool(left) and decision.target == left[-1]  # a return
        self._stints.append((decision.target, []))

    def measured_gain(self) -> float | None:
        """Mean step seconds on the split left last minus on the current one (None before a move or a step)."""
        measured = self._measured()
        if not self.left or self.current not in measured or self.left[-1] not in measured:
            return None
        return _mean([s.step_s for s in measured[self.left[-1]]]) - _mean([s.step_s for s in measured[self.current]])
