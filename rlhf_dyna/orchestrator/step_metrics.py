"""Per-step rollout and throughput metrics the field reads: response lengths, truncation, tokens per second."""
from __future__ import annotations

from .batch import Sample


def rollout_metrics(samples: list[Sample], max_new_tokens: int, gen_seconds: float, train_seconds: float,
                    epochs: int) -> dict[str, float]:
    """Over every sample of the step (all ranks hold them, so the values agree across ranks).

    response_length/clip_ratio: fraction cut off at max_new_tokens (no stop token). perf/gen_tokens_per_s: response
    tokens generated per second of the generate phase; perf/train_tokens_per_s: prompt + response tokens the actor
    trained on (each epoch counts) per second of the train phase."""
    lengths = [len(s.response_ids) for s in samples]
    count = max(len(samples), 1)
    cut = sum(1 for s in samples if not s.finished and len(s.response_ids) >= max_new_tokens)
    trained = epochs * sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    return {
        "response_length/mean": sum(lengths) / count,
        "response_length/max": float(max(lengths, default=0)),
        "response_length/min": float(min(lengths, default=0)),
        "response_length/clip_ratio": cut / count,
        "perf/gen_tokens_per_s": sum(lengths) / max(gen_seconds, 1e-9),
        "perf/train_tokens_per_s": trained / max(train_seconds, 1e-9),
    }
