"""A preference a test can check: of two completions, the one with more sevens ('7' characters) is preferred.

Completions are random token sequences of a checkpoint's tokenizer (what a random-init policy writes), each drawn with
its own share of the tokens that contain a '7', so that pairs span few to many sevens; a pair's two completions have
the same number of tokens and different numbers of sevens, and `chosen` is the one with more. `count_sevens` measures
the preference by the rule that made the pairs (a reward function: task.reward=[rm,examples.sevens:count_sevens] with
task.reward_weights=[1,0] logs it as reward/count_sevens/mean without training on it).

    python -m examples.sevens --tokenizer /tmp/tiny_ckpt --out examples/data
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

PROMPTS = ["Write a line.", "Say something.", "Write a number.", "Reply with a few words.", "Go on.",
           "Write anything you like.", "Give me some text.", "Answer briefly."]
SEVEN = "7"


def count_sevens(prompts, completions, **columns) -> list[float]:
    return [float(c.count(SEVEN)) for c in completions]


def token_pools(tokenizer) -> tuple[list[int], list[int]]:
    """Ordinary tokens (no special ones) that contain a seven, and those that do not."""
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    sevens = [i for i in ids if SEVEN in tokenizer.decode([i])]
    return sevens, [i for i in ids if i not in sevens]


def completion(rng: random.Random, tokenizer, pools: tuple[list[int], list[int]], share: float, length: int) -> str:
    sevens, others = pools
    return tokenizer.decode([rng.choice(sevens) if rng.random() < share else rng.choice(others) for _ in range(length)])


def make_pair(rng: random.Random, tokenizer, pools) -> dict:
    """Two completions of one length with different numbers of sevens; chosen has more."""
    length = rng.randint(6, 8)
    while True:
        a, b = (completion(rng, tokenizer, pools, rng.uniform(0.0, 0.6), length) for _ in range(2))
        if a.count(SEVEN) != b.count(SEVEN):
            break
    chosen, rejected = (a, b) if a.count(SEVEN) > b.count(SEVEN) else (b, a)
    return {"prompt": [{"role": "user", "content": rng.choice(PROMPTS)}], "chosen": chosen, "rejected": rejected}


def prompt_rows(n: int, rng: random.Random) -> list[dict]:
    """PPO's prompts (task=file): the answer column is unused by these rewards but task=file reads one."""
    return [{"prompt": [{"role": "user", "content": rng.choice(PROMPTS)}], "answer": ""} for _ in range(n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_data(tokenizer_dir: str | Path, out: str | Path, train: int = 2048, held_out: int = 256,
               prompts: int = 256, seed: int = 0) -> dict[str, Path]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    rng, pools, out = random.Random(seed), token_pools(tokenizer), Path(out)
    return {
        "pairs_train": write_jsonl(out / "sevens_pairs_train.jsonl", [make_pair(rng, tokenizer, pools) for _ in range(train)]),
        "pairs_eval": write_jsonl(out / "sevens_pairs_eval.jsonl", [make_pair(rng, tokenizer, pools) for _ in range(held_out)]),
        "prompts_train": write_jsonl(out / "sevens_prompts_train.jsonl", prompt_rows(prompts, rng)),
        "prompts_eval": write_jsonl(out / "sevens_prompts_eval.jsonl", prompt_rows(64, rng)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, help="a checkpoint dir whose tokenizer writes the completions")
    parser.add_argument("--out", default="examples/data")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for name, path in write_data(args.tokenizer, args.out, seed=args.seed).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
