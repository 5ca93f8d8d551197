"""One-dimensional splitting rules: which interval of a length each coordinate of a mesh axis gets."""
from __future__ import annotations

from typing import Callable

Intervals = list[tuple[int, int]]
# A rule maps (length, axis size) to one half-open interval per axis coordinate.
Rule = Callable[[int, int], Intervals]


def chunk(n: int, parts: int) -> Intervals:
    """torch.chunk semantics as FSDP2 and DTensor Shard use them: ceil-sized chunks, trailing ones short or empty."""
    size = -(-n // parts) if n else 0
    return [(min(i * size, n), min((i + 1) * size, n)) for i in range(parts)]


def even(n: int, parts: int) -> Intervals:
    """Equal parts; callers validate divisibility first."""
    size = n // parts
    return [(i * size, (i + 1) * size) for i in range(parts)]


def linear(n: int, parts: int) -> Intervals:
    """vLLM's linear expert placement: the first n % parts ranks get one extra."""
    base, rem = divmod(n, parts)
    out, lo = [], 0
    for i in range(parts):
        hi = lo + base + (1 if i < rem else 0)
        out.append((lo, hi))
        lo = hi
    return out


def replicated_groups(groups: int) -> Rule:
    """n split into `groups` equal parts, axis coordinate t reading part t // (parts / groups) (vLLM KV heads)."""

    def rule(n: int, parts: int) -> Intervals:
        per_group = even(n, groups)
        return [per_group[t // (parts // groups)] for t in range(parts)]

    return rule


def padded(padded_len: int) -> Rule:
    """Even split of a padded length, clipped to the real length (vLLM's vocab-parallel rows)."""

    def rule(n: int, parts: int) -> Intervals:
        per = padded_len // parts
        return [(min(t * per, n), min((t + 1) * per, n)) for t in range(parts)]

    return rule


def full(n: int, parts: int) -> Intervals:
    """Every coordinate holds everything (replication along this axis)."""
    return [(0, n)] * parts


def pad_to_multiple(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


VOCAB_PADDING = 64  # vllm DEFAULT_VOCAB_PADDING_SIZE


def vllm_padded_vocab(vocab: int) -> int:
    """vLLM's vocab-parallel row count: the vocabulary padded to a multiple of 64, then split evenly over tp (tp must
    divide it); padding rows belong to no logical tensor. The one place this rule is written."""
    return pad_to_multiple(vocab, VOCAB_PADDING)
