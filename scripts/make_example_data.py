"""Write the example task=file dataset: chat prompts of small arithmetic word problems with GSM8K-style answers.

    python scripts/make_example_data.py            # examples/data/arith_chat_{train,eval}.jsonl
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SYSTEM = "Solve the problem. End with the final answer as '#### <number>'."
TEMPLATES = [
    ("{a} apples and {b} more apples. How many apples?", lambda a, b: a + b),
    ("A box holds {a} pens; {b} are taken out. How many pens are left?", lambda a, b: a - b),
    ("{a} rows of {b} chairs. How many chairs?", lambda a, b: a * b),
]


def make_rows(n: int, rng: random.Random) -> list[dict]:
    rows = []
    for _ in range(n):
        kind = rng.randrange(len(TEMPLATES))
        text, solve = TEMPLATES[kind]
        a, b = rng.randint(2, 50), rng.randint(1, 20)
        if kind == 1 and b > a:
            a, b = b, a
        rows.append({
            "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text.format(a=a, b=b)}],
            "answer": f"#### {solve(a, b)}",
            "kind": ["add", "sub", "mul"][kind],  # an extra column: reward functions receive it by name
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="examples/data")
    parser.add_argument("--train", type=int, default=256)
    parser.add_argument("--eval", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", args.train), ("eval", args.eval)):
        path = out / f"arith_chat_{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in make_rows(n, rng)))
        print(f"wrote {n} rows to {path}")


if __name__ == "__main__":
    main()
