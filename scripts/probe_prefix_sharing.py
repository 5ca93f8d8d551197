"""What training the n samples of a prompt on one shared prompt forward would save (issue 31's next lever), measured
on one process before it is built: one forward + backward of the response log-probs of one rank's rows of
bench_peer's shapes, as the engine runs it today (every row carries its prompt) and packed (one row per prompt: the
prompt once, then its n responses, each attending to the prompt and to itself only, through a 4-D attention mask,
positions continuing from the prompt). Prints the log-probs' largest difference and the median seconds of each.

    python scripts/probe_prefix_sharing.py CHECKPOINT --prompts 8 --n 8 --prompt 100 --response 32 \
        --out docs/bench/prefix_sharing_probe.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def response_logprobs(logits: torch.Tensor, predictors: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) read at the `predictors` columns of `logits` ([rows, columns, vocab])."""
    chosen = logits[:, predictors.reshape(-1)].float()
    return torch.log_softmax(chosen, -1).gather(-1, targets.reshape(targets.shape[0], -1, 1)).squeeze(-1)


def unpacked(model, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    """Today: each of the n samples is a row of its own, prompt included."""
    groups, n, length = responses.shape
    ids = torch.cat([prompts.repeat_interleave(n, 0), responses.reshape(groups * n, length)], 1)
    logits = model(input_ids=ids, use_cache=False, logits_to_keep=length + 1).logits
    return response_logprobs(logits, torch.arange(length), ids[:, -length:])


def packed(model, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    """One row per prompt: [prompt, response 1, ..., response n]; response i sees the prompt and itself."""
    groups, n, length = responses.shape
    width, total = prompts.shape[1], prompts.shape[1] + n * length
    allowed = torch.zeros(total, total, dtype=torch.bool)
    allowed[:width, :width] = torch.ones(width, width, dtype=torch.bool).tril()
    starts = [width + i * length for i in range(n)]
    for s in starts:
        allowed[s:s + length, :width] = True
        allowed[s:s + length, s:s + length] = torch.ones(length, length, dtype=torch.bool).tril()
    mask = torch.zeros(total, total).masked_fill(~allowed, float("-inf"))[None, None].expand(groups, 1, total, total)
    positions = torch.cat([torch.arange(width), (width + torch.arange(length)).repeat(n)])[None].expand(groups, total)
    ids = torch.cat([prompts, responses.reshape(groups, n * length)], 1)
    logits = model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=False).logits
    # response i's first token is predicted at the prompt's last column, its token t > 0 at column s + t - 1
    predictors = torch.stack([torch.cat([torch.tensor([width - 1]), s + torch.arange(length - 1)]) for s in starts])
    return response_logprobs(logits, predictors, responses.reshape(groups, n * length)).reshape(groups * n, length)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--prompts", type=int, default=8, help="prompts on one rank")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--prompt", type=int, default=100, help="prompt tokens")
    parser.add_argument("--response", type=int, default=32, help="response tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one rank of two on the 2-core machine
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32, attn_implementation="sdpa")
    vocab = model.config.vocab_size
    prompts = torch.randint(1, vocab, (args.prompts, args.prompt))
    responses = torch.randint(1, vocab, (args.prompts, args.n, args.response))
    with torch.no_grad():
        difference = (unpacked(model, prompts, responses) - packed(model, prompts, responses)).abs().max().item()
    seconds: dict[str, list[float]] = {"unpacked": [], "packed": []}
    for _ in range(args.repeats):
        for name, forward in (("unpacked", unpacked), ("packed", packed)):
            start = time.perf_counter()
            forward(model, prompts, responses).sum().backward()
            seconds[name].append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
    medians = {k: statistics.median(v) for k, v in seconds.items()}
    print(f"log-probs differ by at most {difference:.2e}; forward + backward: unpacked {medians['unpacked']:.3f} s, "
          f"packed {medians['packed']:.3f} s, packed / unpacked {medians['packed'] / medians['unpacked']:.2f}x")
    if args.out:
        args.out.write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, 1 thread", "config": model.config.to_dict(),
            "shape": {k: getattr(args, k) for k in ("prompts", "n", "prompt", "response")},
            "max_logprob_difference": difference, "seconds": seconds, "median_s": medians,
            "ratio": medians["packed"] / medians["unpacked"]}, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
