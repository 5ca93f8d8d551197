"""A model catalog cut into groups of consecutive decoder layers, each at most `limit_bytes` per rank: transitions
that must stage their destination (vLLM on the CPU) run and install group by group, so staging memory is bounded by
the group size, not by the model. Non-layer tensors (embeddings, final norm, lm_head) form their own groups: the
ones before the first layer and the ones after the last."""
from __future__ import annotations

from math import prod

from .model import CatalogTensor, ModelCatalog


def sub_catalog(catalog: ModelCatalog, tensors: tuple[CatalogTensor, ...]) -> ModelCatalog:
    """The same model (dims, dtypes) restricted to `tensors`: its layouts and plans cover only them."""
    return ModelCatalog(catalog.arch, catalog.dims, tensors, catalog.param_dtype, catalog.state_dtype)


def layer_groups(catalog: ModelCatalog, tp: int, itemsize: int, limit_bytes: int) -> list[tuple[CatalogTensor, ...]]:
    """Groups in model order; a group's bytes per rank (numel * itemsize / tp, an upper bound for a TP-sharded rank)
    stay within limit_bytes unless one layer alone exceeds it. Same answer on every rank (catalog arithmetic)."""
    def nbytes(t: CatalogTensor) -> int:
        return prod(t.shape) * itemsize // tp

    by_layer: dict[int, list[CatalogTensor]] = {}
    head, tail = [], []
    for t in catalog.tensors:
        if t.layer is not None:
            by_layer.setdefault(t.layer, []).append(t)
        else:
            (head if not by_layer else tail).append(t)  # catalogs list embeddings first, final norm / lm_head last
    groups: list[tuple[CatalogTensor, ...]] = [tuple(head)] if head else []
    current: list[CatalogTensor] = []
    for layer in sorted(by_layer):
        tensors = by_layer[layer]
        if current and sum(map(nbytes, current + tensors)) > limit_bytes:
            groups.append(tuple(current))
            current = []
        current += tensors
    if current:
        groups.append(tuple(current))
    if tail:
        groups.append(tuple(tail))
    return groups
