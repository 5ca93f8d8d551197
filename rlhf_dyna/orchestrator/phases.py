"""Generation, evaluation and supervised warm-up phases of one rank."""
from __future__ import annotations

import random
import time

import torch
import torch.distributed as dist

from ..config import Config
from ..tasks.base import Example, Task
from ..tasks.tokenizer import CharTokenizer
from .batch import Sample, gather_samples, pack, shard_rows
from .objectives import sft_loss


def replica_slice(items: list, ctx) -> tuple[int, list]:
    """The contiguous share of `items` that this rank's rollout replica serves (TP ranks share it)."""
    per = len(items) // ctx.rollout_replicas
    start = ctx.rollout_replica * per
    return start, items[start : start + per]


def prompt_ids(tokenizer: CharTokenizer, example: Example) -> list[int]:
    return tokenizer.encode(example.prompt, add_bos=True)


def generate(cfg: Config, rollout, task: Task, tokenizer: CharTokenizer, prompts: list[Example], ctx,
             greedy: bool = False, seed: int | None = None) -> list[Sample]:
    """This replica's prompts, n samples each, scored by the task's reward."""
    r = cfg.rollout
    n = 1 if greedy else r.n
    start, mine = replica_slice(prompts, ctx)
    ids = [prompt_ids(tokenizer, e) for e in mine]
    outputs = rollout.generate(
        ids, n=n, temperature=0.0 if greedy else r.temperature, top_p=1.0 if greedy else r.top_p,
        top_k=-1 if greedy else r.top_k, max_tokens=r.max_new_tokens, stop_token_ids=[tokenizer.eos_id],
        seed=seed,
    )
    samples = []
    for i, (example, p_ids, outs) in enumerate(zip(mine, ids, outputs)):
        for out in outs:
            response = list(out.token_ids)
            samples.append(Sample(
                prompt_index=start + i, prompt_ids=p_ids, response_ids=response,
                reward=task.reward(example, tokenizer.decode(response)),
                finished=bool(response) and response[-1] == tokenizer.eos_id,
            ))
    return samples


def evaluate(cfg: Config, rollout, task: Task, tokenizer: CharTokenizer, ctx, prefix: str = "eval") -> dict[str, float]:
    """Greedy decoding on the held-out set: exact-match accuracy and mean task reward."""
    t0 = time.perf_counter()
    examples = task.eval_set()
    usable = len(examples) - len(examples) % ctx.rollout_replicas
    local = generate(cfg, rollout, task, tokenizer, examples[:usable], ctx, greedy=True)
    samples = sorted(gather_samples(local, ctx.is_rollout_leader), key=lambda s: s.prompt_index)
    texts = [tokenizer.decode(s.response_ids) for s in samples]
    return {
        f"{prefix}/accuracy": task.accuracy(examples[:usable], texts),
        f"{prefix}/reward": sum(s.reward for s in samples) / len(samples),
        f"timing_s/{prefix}": time.perf_counter() - t0,
    }


def supervised_warmup(cfg: Config, actor, task: Task, tokenizer: CharTokenizer, ctx) -> dict[str, float]:
    """Optional short SFT on task demonstrations (loss on the answer tokens only), at trainer.sft_lr."""
    steps = cfg.trainer.sft_warmup_steps
    if steps <= 0:
        return {}
    t0 = time.perf_counter()
    rng = random.Random(cfg.trainer.seed + 2)
    saved_lrs = [g["lr"] for g in actor.optimizer.param_groups]
    for group in actor.optimizer.param_groups:
        group["lr"] = cfg.trainer.sft_lr
    metrics: dict[str, float] = {}
    for _ in range(steps):
        examples = task.sft_examples(cfg.trainer.sft_batch_size, rng)  # identical on every rank
        samples = [Sample(i, prompt_ids(tokenizer, e), tokenizer.encode(e.completion)) for i, e in enumerate(examples)]
        batch = shard_rows(pack(samples, tokenizer.pad_id), ctx.dp_rank, ctx.dp)
        metrics = actor.step(batch, sft_loss())
    for group, lr in zip(actor.optimizer.param_groups, saved_lrs):
        group["lr"] = lr
    actor.optimizer.state.clear()  # RL starts with fresh Adam moments at its own learning rate
    return {"sft/loss": metrics["sft_loss"], "sft/steps": float(steps), "timing_s/sft": time.perf_counter() - t0}
