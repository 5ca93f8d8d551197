"""A model catalog cut into groups of consecutive decoder layers, each at most `limit_bytes` per rank: transitions
that must stage their destination (vLLM on the CPU) run and install group by group, so staging memory is bounded by
the group size, not by the model. Non-layer tensors (embeddings before the first layer; final norm and lm_head after
the last) join the first and the last group when they fit: every group costs a round of messages and an install."""
from __future__ import annotations

from math import prod

from .model import CatalogTensor, ModelCatalog


def sub_catalog(catalog: ModelCatalog, tensors: tuple[CatalogTensor, ...]) -> ModelCatalog:
    """The same model (dims, dtypes) restricted to `tensors`: its layouts and plans cover only them."""
    return ModelCatalog(catalog.arch, catalog.dims, tensors, catalog.param_dtype, catalog.state_dtype)


def layer_groups(catalog: ModelCatalog, tp: int, itemsize: int, limit_bytes: int) -> list[tuple[CatalogTensor, ...]]:
    """Groups in model order; a group's bytes per rank (numel * itemsize / tp, an upper bound for a TP-sharded rank)
    stay within limit_bytes unless one unit alone exceeds it (a layer, or the tensors before / after the layers).
    Same answer on every rank (catalog arithmetic)."""
    def nbytes(tensors: list[CatalogTensor]) -> int:
        return sum(prod(t.shape) * itemsize // tp for t in tensors)

    by_layer: dict[int, list[CatalogTensor]] = {}
    head, tail = [], []
    for t in catalog.tensors:
        if t.layer is not None:
            by_layer.setdefault(t.layer, []).append(t)
        else:
            (head if not by_layer else tail).append(t)  # catalogs list embeddings first, final norm / lm_head last
    units = [u for u in (head, *(by_layer[i] for i in sorted(by_layer)), tail) if u]
    groups: list[tuple[CatalogTensor, ...]] = []
    current: list[CatalogTensor] = []
    for unit in units:
        if current and nbytes(current + unit) > limit_bytes:
            groups.append(tuple(current))
            current = []
        current += unit
    if current:
        groups.append(tuple(current))
    return groups
