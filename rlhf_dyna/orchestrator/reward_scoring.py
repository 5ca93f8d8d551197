"""The reward model's phase of a step: the samples scored by a sequence classifier, the score joining their rewards as
`rm` (task.reward, weighted by task.reward_weights).

The reward model lives on its placement's rank set (elastic.policies: every rank under colocate, the train set under
split, a set of its own under lend with +placement.roles.reward_model=[first,size]) in a dp x tp layout with the
training layout's tp, built on meta and loaded per shard. Every rank calls `score_samples`: the ranks of the set score
their dp share of the step's samples (prompt + completion in the reward model's own format and tokenizer,
tasks.reward_text), and one all_reduce gives every rank every score. With reward_model.offload=true its shards wait in
host memory outside the prepare phase (transition.host_offload), copied back to score; the copies are logged under the
placement's own change names (`reshard/reward_model/<from>_to_<to>/{seconds,bytes_moved}`).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import Tensor

from ..config import Config
from ..elastic.placement import PREPARE, REWARD_MODEL, Change, Placement, changes
from ..parallel_layout import ParallelLayout
from ..tasks.hf_tokenizer import HFTokenizer
from ..tasks.reward_text import reward_ids
from ..tasks.rewards import LEARNED, RewardSet
from ..train.engine import TrainEngine
from ..train.mesh import build_mesh
from ..transition.host_offload import CopyStats, HostCopy
from ..transition.transport import wire_device, world_transport
from .batch import Sample
from .build import build_reward_engine
from .placements import placement_of, scores_with_reward_model

TIMING = "timing_s/reward_model"


def padded_rows(rows: list[list[int]], pad_id: int) -> dict[str, Tensor]:
    """Right-padded input_ids and attention_mask of token lists."""
    length = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, : len(r)] = torch.tensor(r)
        attention_mask[i, : len(r)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def score_rows(engine: TrainEngine | None, rows: list[list[int]], count: int, pad_id: int) -> list[float]:
    """Collective over the world: the `count` rows' scores on every rank (`rows`: given where `engine` is). Each dp rank of the engine scores a contiguous
    share (the last share padded with repeats, so every dp rank passes as many rows); TP rank 0 of each share adds
    it to a zero vector that one all_reduce completes (each entry has one contributor, so the sum is exact)."""
    total = torch.zeros(count, dtype=torch.float64, device=wire_device(world_transport()))
    if engine is not None and rows:
        per = -(-len(rows) // engine.dp_size)
        start = engine.dp_rank * per
        mine = rows[start : start + per]
        batch = padded_rows(mine + [rows[-1]] * (per - len(mine)), pad_id)
        scores = engine.scores(batch["input_ids"], batch["attention_mask"])[: len(mine)]
        if engine.mesh["tp"].get_local_rank() == 0:
            total[start : start + len(mine)] = scores.to(total)
    dist.all_reduce(total)
    return total.cpu().tolist()


class RewardScorer:
    """This rank's part of the reward-model role (its engine where the rank is in the set, None elsewhere)."""

    def __init__(self, cfg: Config, rewards: RewardSet, policy_tokenizer, build: bool = True) -> None:
        """`build`: the engine built on its set (collective); False: none yet (a joining rank: it comes by plan)."""
        placement = placement_of(cfg)
        self.cfg = cfg
        self.engine: TrainEngine | None = reward_engine_on(cfg, placement) if build else None
        self.tokenizer = HFTokenizer(cfg.reward_model.path)
        self.policy_tokenizer = policy_tokenizer
        self.rewards = rewards
        moves = [c for c in changes(placement) if c.role == REWARD_MODEL]
        self.unpark: Change | None = next((c for c in moves if c.src.parked), None)
        self.park: Change | None = next((c for c in moves if c.dst.parked), None)
        self.host = HostCopy(self.engine) if self.engine is not None and self.park is not None else None
        if self.host is not None:
            self.host.park()  # it waits in host memory until the first phase it scores in (no collective here)

    def rebuild(self, placement: Placement) -> TrainEngine | None:
        """Collective over a new world (a lost rank's recovery): the frozen reward model built again from its files on
        `placement`'s set, as at the start; nothing of it needs a replica. This rank's engine (None off the set)."""
        self.engine = None  # the old world's shards, freed before the new ones load
        self.engine = reward_engine_on(self.cfg, placement)
        return self.engine

    @property
    def pad_id(self) -> int | None:
        """The id transformers finds each row's last token by (checks.reward_model: every reward model has one)."""
        return self.engine.model.config.pad_token_id if self.engine is not None else None

    def texts_ids(self, samples: list[Sample]) -> list[list[int]]:
        """Each sample's prompt and decoded completion in the reward model's format, as its token ids."""
        return [reward_ids(self.tokenizer, s.prompt, self.policy_tokenizer.decode(s.response_ids)) for s in samples]

    def scores(self, samples: list[Sample]) -> list[float]:
        """Collective: the reward model's score of every sample, on every rank."""
        rows = self.texts_ids(samples) if self.engine is not None else []
        return score_rows(self.engine, rows, len(samples), self.pad_id)

    def apply(self, samples: list[Sample]) -> dict[str, float]:
        """Collective: the scores join each sample's reward parts as `rm` and its weighted total is summed again;
        timing_s/reward_model (the scoring) and, when offloaded, the host copies' metrics."""
        metrics = self._copy(self.unpark, parking=False) if self.unpark is not None else {}
        start = time.perf_counter()
        for sample, score in zip(samples, self.scores(samples), strict=True):
            sample.reward_parts[LEARNED] = score
            sample.reward = self.rewards.weighted(sample.reward_parts)
        metrics[TIMING] = time.perf_counter() - start  # the scoring alone; the host copies have their own seconds
        if self.park is not None:
            metrics.update(self._copy(self.park, parking=True))
        return metrics

    def _copy(self, change: Change, parking: bool) -> dict[str, float]:
        """Collective: the host copy of this rank's shards (none outside the set); the slowest rank's seconds and
        the bytes of every rank."""
        stats = CopyStats(0.0, 0) if self.host is None else self.host.park() if parking else self.host.unpark()
        device = wire_device(world_transport())
        seconds, moved = (torch.tensor([v], dtype=torch.float64, device=device) for v in (stats.seconds, stats.bytes_copied))
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        dist.all_reduce(moved)
        return {f"{change.name}/seconds": float(seconds), f"{change.name}/bytes_moved": float(moved)}


def reward_engine_on(cfg: Config, placement: Placement) -> TrainEngine | None:
    """Collective: the reward model loaded per shard from reward_model.path on `placement`'s reward-model set (dp x tp
    with the training tp, ZeRO-3); None on a rank off the set."""
    ranks = placement.slot(PREPARE, REWARD_MODEL).ranks
    tp = cfg.parallel.train.tp
    layout = ParallelLayout(ranks.size // tp, tp, zero=3, first_rank=ranks.first)
    mesh = build_mesh(layout)  # collective: every rank takes part in creating the set's groups
    return build_reward_engine(cfg, mesh) if dist.get_rank() in layout.ranks else None


def make_scorer(cfg: Config, task, policy_tokenizer, build: bool = True) -> RewardScorer | None:
    """Collective where `build`: the run's reward-model role, or None when task.reward does not name `rm`."""
    if not scores_with_reward_model(cfg):
        return None
    return RewardScorer(cfg, task.rewards, policy_tokenizer, build)
