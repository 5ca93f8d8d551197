"""TRL's GRPOTrainer on a local checkpoint and a jsonl of chat prompts, timed per step: the peer of
scripts/bench_peer.py. Runs inside the TRL venv (scripts/install_trl_peer.sh), so it imports nothing of rlhf_dyna;
one process, or several under torchrun (accelerate's CPU data parallel over gloo, each process its share of the
prompts); rank 0 writes {"steps": [{"step_s", "generate_s", "train_s"}, ...], "versions": {...}} to --out.

Generation is TRL's own (transformers `generate`; vLLM is a GPU option there), scoring is the same "#### N" answer
check rlhf_dyna's math reward makes; beta 0 (no reference model), one optimizer step per batch (TRL then skips the
old-log-prob forward, as rlhf_dyna does).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

import torch
import transformers
import trl
from datasets import load_dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

ANSWER = re.compile(r"####\s*(-?\d+)")


def answer_reward(prompts, completions, answer, **_) -> list[float]:
    """1.0 where the completion's last '#### N' equals the row's, else 0.0."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    out = []
    for text, truth in zip(texts, answer):
        got, want = ANSWER.findall(text), ANSWER.findall(truth)
        out.append(float(bool(got) and bool(want) and got[-1] == want[-1]))
    return out


class TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that records how long each generation (sampling and scoring) took."""

    generation_seconds: list[float] = []

    def _generate_and_score_completions(self, inputs):
        start = time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        self.generation_seconds.append(time.perf_counter() - start)
        return out


class StepTimer(TrainerCallback):
    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self._start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--prompts", type=int, required=True, help="prompts per step")
    parser.add_argument("--samples", type=int, required=True, help="samples per prompt (TRL num_generations)")
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    processes = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's
    config = GRPOConfig(
        output_dir=str(Path(args.out).parent / "trl_out"), use_cpu=True, bf16=args.precision == "bf16",
        per_device_train_batch_size=args.prompts * args.samples // processes, gradient_accumulation_steps=1,
        num_generations=args.samples, max_completion_length=args.max_new_tokens, temperature=1.0, learning_rate=1e-6,
        beta=0.0, num_iterations=1, max_steps=args.steps, logging_steps=1, report_to=[], save_strategy="no",
        seed=0, disable_tqdm=True, dataloader_num_workers=0,
    )
    dataset = load_dataset("json", data_files=args.data, split="train")
    timer = StepTimer()
    trainer = TimedGRPOTrainer(model=args.checkpoint, reward_funcs=answer_reward, args=config, train_dataset=dataset,
                               callbacks=[timer])
    trainer.train()
    if int(os.environ.get("RANK", "0")):
        os._exit(0)  # under torchrun gloo's threads abort (SIGABRT) or hang the interpreter's teardown
    steps = [{"step_s": s, "generate_s": g, "train_s": s - g}
             for s, g in zip(timer.seconds, TimedGRPOTrainer.generation_seconds)]
    Path(args.out).write_text(json.dumps({
        "steps": steps, "threads": args.threads, "processes": processes,
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
    }, indent=1))
    os._exit(0)  # the report is written: no teardown (see above)


if __name__ == "__main__":
    main()
