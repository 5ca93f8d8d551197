"""samples.jsonl: the first few rollout samples of every step, ids and text, to see what the model was given."""
from __future__ import annotations

import json
from pathlib import Path

SAMPLES_FILE = "samples.jsonl"


def log_samples(out_dir: Path, step: int, samples: list, tokenizer, limit: int) -> None:
    """Append `limit` samples of `step`: prompt_ids exactly as vLLM received them, their decoding, and the reward."""
    with open(Path(out_dir) / SAMPLES_FILE, "a") as f:
        for s in samples[:limit]:
            f.write(json.dumps({
                "step": step, "prompt_index": s.prompt_index, "prompt": s.prompt, "prompt_ids": s.prompt_ids,
                "response_ids": s.response_ids,
                "prompt_text": tokenizer.decode(s.prompt_ids, skip_special_tokens=False),
                "response_text": tokenizer.decode(s.response_ids), "reward": s.reward, "reward_parts": s.reward_parts,
            }) + "\n")
