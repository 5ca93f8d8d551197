"""Generation, evaluation and supervised warm-up phases of one rank."""
from __future__ import annotations

import random
import time

import torch
import torch.distributed as dist

from ..config import Config
from ..tasks.base import BaseTask as Task
from ..tasks.base import Example
from ..tasks.hf_tokenizer import HFTokenizer
from ..tasks.tokenizer import CharTokenizer
from ..tracking.console import announce
from .batch import Sample, gather_samples, pack, shard_rows
from .objectives import sft_loss


def replica_slice(items: list, ctx) -> tuple[int, list]:
    """The contiguous share of `items` that this rank's rollout replica serves (TP ranks share it)."""
    per = len(items) // ctx.rollout_replicas
    start = ctx.rollout_replica * per
    return start, items[start : start + per]


Tokenizer = CharTokenizer | HFTokenizer


def prompt_ids(tokenizer: Tokenizer, example: Example) -> list[int]:
    return tokenizer.encode_prompt(example.prompt)


def reward_part_means(samples: list[Sample]) -> dict[str, float]:
    """reward/<name>/mean for each named reward function (task=file)."""
    names = samples[0].reward_parts if samples else {}
    return {f"reward/{n}/mean": sum(s.reward_parts[n] for s in samples) / len(samples) for n in names}


def generate(cfg: Config, rollout, task: Task, tokenizer: Tokenizer, prompts: list[Example], ctx,
             greedy: bool = False, seed: int | None = None) -> list[Sample]:
    """This replica's prompts, n samples each, scored by the task's reward."""
    r = cfg.rollout
    n = 1 if greedy else r.n
    start, mine = replica_slice(prompts, ctx)
    ids = [prompt_ids(tokenizer, e) for e in mine]
    outputs = rollout.generate(
        ids, n=n, temperature=0.0 if greedy else r.temperature, top_p=1.0 if greedy else r.top_p,
        top_k=-1 if greedy else r.top_k, max_tokens=r.max_new_tokens, stop_token_ids=tokenizer.eos_ids,
        seed=seed, first_index=start,  # global prompt indices: the same samples under any replica count
    )
    samples, examples, texts = [], [], []
    stops = set(tokenizer.eos_ids)
    for i, (example, p_ids, outs) in enumerate(zip(mine, ids, outputs)):
        for out in outs:
            response = list(out.token_ids)
            samples.append(Sample(prompt_index=start + i, prompt_ids=p_ids, response_ids=response,
                                  finished=bool(response) and response[-1] in stops))
            examples.append(example)
            texts.append(tokenizer.decode(response))
    rewards, parts = task.score(examples, texts)  # one batch call: user reward fns get lists
    for j, sample in enumerate(samples):
        sample.reward = rewards[j]
        sample.reward_parts = {name: values[j] for name, values in parts.items()}
    return samples


def evaluate(cfg: Config, rollout, task: Task, tokenizer: Tokenizer, ctx, prefix: str = "eval") -> dict[str, float]:
    """Greedy decoding on the held-out set: exact-match accuracy and mean task reward."""
    t0 = time.perf_counter()
    examples = task.eval_set()
    usable = len(examples) - len(examples) % ctx.rollout_replicas
    announce(f"evaluating {usable} prompts ({prefix})...")
    local = generate(cfg, rollout, task, tokenizer, examples[:usable], ctx, greedy=True)
    samples = sorted(gather_samples(local, ctx.is_rollout_leader), key=lambda s: s.prompt_index)
    texts = [tokenizer.decode(s.response_ids) for s in samples]
    return {
        f"{prefix}/accuracy": task.eval_accuracy(examples[:usable], texts, [s.reward for s in samples]),
        f"{prefix}/reward": sum(s.reward for s in samples) / len(samples),
        f"timing_s/{prefix}": time.perf_counter() - t0,
    }


def supervised_warmup(cfg: Config, actor, task: Task, tokenizer: Tokenizer, ctx) -> dict[str, float]:
    """Optional short SFT on task demonstrations (loss on the answer tokens only), at trainer.sft_lr."""
    steps = cfg.trainer.sft_warmup_steps
    if steps <= 0:
        return {}
    t0 = time.perf_counter()
    announce(f"supervised warm-up, {steps} steps...")
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
