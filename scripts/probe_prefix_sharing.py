"""What training the n samples of a prompt on one shared prompt forward saves (algorithm.share_prompts), on one
process: one forward + backward of the response log-probs of one rank's rows of bench_peer's shapes, every row
carrying its prompt, against the rows packed by `train.shared_prompts` (one row per prompt: the prompt once, then its
n responses under a 4-D attention mask), with the engine's own log-prob code. Prints the log-probs' largest
difference and the median seconds of each.

    python scripts/probe_prefix_sharing.py CHECKPOINT --prompts 8 --n 8 --prompt 100 --response 32 \
        --out docs/bench/prefix_sharing_tiny.json
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

from rlhf_dyna.orchestrator.batch import Sample, pack
from rlhf_dyna.train.engine import position_ids_from_mask
from rlhf_dyna.train.logprobs import logits_to_keep, token_logprobs
from rlhf_dyna.train.shared_prompts import pack_shared_prompts, unpacked_logits


def rows_forward(model, batch: dict[str, torch.Tensor], keep: int) -> torch.Tensor:
    """Today's default: every row carries its prompt (TrainEngine.forward without share_prompts)."""
    mask = batch["attention_mask"]
    return model(input_ids=batch["input_ids"], attention_mask=mask, position_ids=position_ids_from_mask(mask),
                 use_cache=False, logits_to_keep=keep).logits


def packed_forward(model, batch: dict[str, torch.Tensor], keep: int) -> torch.Tensor:
    """algorithm.share_prompts=on (TrainEngine._forward_packed)."""
    packing = pack_shared_prompts(batch["input_ids"], batch["attention_mask"], batch["response_mask"])
    out = model(input_ids=packing.input_ids, position_ids=packing.position_ids, attention_mask=packing.attention_mask,
                use_cache=False, logits_to_keep=packing.input_ids.shape[1] - packing.first_kept)
    return unpacked_logits(out.logits, packing, keep)


def response_logprobs(forward, model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    keep = logits_to_keep(batch["response_mask"])
    return token_logprobs(forward(model, batch, keep), batch["input_ids"]) * batch["response_mask"]


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
    samples = []
    for p in range(args.prompts):
        prompt = torch.randint(1, vocab, (args.prompt,)).tolist()
        samples += [Sample(p, prompt, torch.randint(1, vocab, (args.response,)).tolist()) for _ in range(args.n)]
    batch = pack(samples, pad_id=0)
    with torch.no_grad():
        difference = (response_logprobs(rows_forward, model, batch)
                      - response_logprobs(packed_forward, model, batch)).abs().max().item()
    seconds: dict[str, list[float]] = {"unpacked": [], "packed": []}
    for _ in range(args.repeats):
        for name, forward in (("unpacked", rows_forward), ("packed", packed_forward)):
            start = time.perf_counter()
            response_logprobs(forward, model, batch).sum().backward()
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
