"""The pieces of an RL step that every placement runs the same way: training a role on its rows, the KL controller's
update, and the metrics of a step's samples."""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..algos.kl import kl_penalty
from ..config import AlgorithmConfig, Config
from .batch import Sample, split_rows
from .objectives import actor_loss, critic_loss
from .phases import reward_part_means
from .step_metrics import rollout_metrics

def train_on(engine, batch: dict, loss_fn, alg: AlgorithmConfig) -> dict[str, float]:
    """`alg.epochs` passes over the batch, one optimizer step per mini-batch; the last step's metrics."""
    metrics: dict[str, float] = {}
    for _ in range(alg.epochs):
        for mini in split_rows(batch, alg.mini_batches):
            metrics = engine.step(mini, loss_fn)
    return metrics


def role_losses(cfg: Config, kl_coef: float) -> dict[str, object]:
    """The loss of each trained role (the actor's at the controller's current KL coefficient)."""
    alg, r = cfg.algorithm, cfg.rollout
    return {"actor": actor_loss(alg, r.temperature, r.max_new_tokens, kl_coef),
            "critic": critic_loss(alg, r.max_new_tokens)}


def prefixed(role: str, metrics: dict[str, float]) -> dict[str, float]:
    return {f"{role}/{k}": v for k, v in metrics.items() if k != "loss"}


def train_roles(cfg: Config, actor, critic, batch: dict, kl_coef: float) -> dict[str, float]:
    """The actor, then the critic, on this rank's rows; their metrics and timing_s/train_actor|train_critic|train."""
    losses = role_losses(cfg, kl_coef)
    t0 = time.perf_counter()
    metrics = prefixed("actor", train_on(actor, batch, losses["actor"], cfg.algorithm))
    metrics["timing_s/train_actor"] = time.perf_counter() - t0
    if critic is not None:
        metrics.update(prefixed("critic", train_on(critic, batch, losses["critic"], cfg.algorithm)))
    metrics["timing_s/train"] = time.perf_counter() - t0
    if critic is not None:
        metrics["timing_s/train_critic"] = metrics["timing_s/train"] - metrics["timing_s/train_actor"]
    return metrics


def kl_metrics_and_update(metrics: dict, batch: dict, actor, kl_ctl, num_samples: int) -> dict[str, float]:
    """actor/kl (k3, token mean over dp, unless the loss logged it) and actor/kl_coef; steps the KL controller."""
    out = {}
    if "actor/kl" not in metrics:
        mask = batch["response_mask"]
        kl = (kl_penalty(batch["old_logprobs"], batch["ref_logprobs"], "k3") * mask).sum()
        kl_sum, tokens = actor.dp_sum(torch.stack([kl, mask.sum()]))
        out["actor/kl"] = float(kl_sum / tokens.clamp(min=1))
    out["actor/kl_coef"] = kl_ctl.value
    kl_ctl.update({**metrics, **out}["actor/kl"], num_samples)  # the same on every rank: actor/kl is a dp-wide mean
    return out


def sample_metrics(cfg: Config, samples: list[Sample], gen_seconds: float, train_seconds: float) -> dict[str, float]:
    """Rewards, response lengths and throughputs of the step's samples (every rank holds all of them)."""
    rewards = torch.tensor([s.reward for s in samples])
    return {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        **reward_part_means(samples),
        **rollout_metrics(samples, cfg.rollout.max_new_tokens, gen_seconds, train_seconds, cfg.algorithm.epochs),
    }


def mean_over_world(values: dict[str, float]) -> dict[str, float]:
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return dict(zip(keys, (t / dist.get_world_size()).tolist()))


def reshard_metrics(name: str, stats) -> dict[str, float]:
    """reshard/<name>/{seconds,bytes_moved,rounds,peak_extra_bytes} of a transition's stats."""
    return {f"{name}/seconds": stats.seconds, f"{name}/bytes_moved": float(stats.bytes_moved),
            f"{name}/rounds": float(stats.rounds), f"{name}/peak_extra_bytes": float(stats.peak_extra_bytes)}
