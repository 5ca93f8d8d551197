"""vps.layer_groups: a catalog cut into layer groups that cover it once, in order, each within the byte limit."""
from __future__ import annotations

from math import prod

import pytest

from rlhf_dyna.models.build import ModelSpec, make_hf_config
from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.vps.layer_groups import layer_groups, sub_catalog
from rlhf_dyna.vps.layout import build_layout
from rlhf_dyna.vps.spec import rollout_spec
from rlhf_dyna.vps.tensor import Kind

SPEC = ModelSpec(arch="llama", vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                 num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize("limit", [1, 60_000, 10**9])
def test_groups_cover_the_catalog_once_in_order_within_the_limit(limit: int) -> None:
    catalog = catalog_from_config(make_hf_config(SPEC), "float32")
    groups = layer_groups(catalog, tp=2, itemsize=4, limit_bytes=limit)
    assert [t for g in groups for t in g] == list(catalog.tensors)
    for g in groups:
        layers = {t.layer for t in g}
        assert len(layers) == 1 or sum(prod(t.shape) * 4 // 2 for t in g) <= limit  # one unit alone may exceed it
    if limit == 1:
        assert len(groups) == SPEC.num_hidden_layers + 2  # every layer alone, head and tail
        assert {t.layer for t in groups[0]} == {t.layer for t in groups[-1]} == {None}
    if limit == 10**9:
        assert len(groups) == 1  # embeddings, layers and lm_head together when they fit


def test_a_sub_catalog_lays_out_only_its_tensors_as_the_whole_does() -> None:
    catalog = catalog_from_config(make_hf_config(SPEC), "float32")
    whole = build_layout(catalog, rollout_spec(2, 1), (Kind.PARAM,))
    group = layer_groups(catalog, tp=2, itemsize=4, limit_bytes=1)[3]
    part = build_layout(sub_catalog(catalog, group), rollout_spec(2, 1), (Kind.PARAM,))
    names = {t.name for t in group}
    for rank in (0, 1):
        assert [p for p in whole.pieces(rank) if p.tensor.name in names] == part.pieces(rank)
