"""One pipeline stage of an HF decoder (causal LM or value model): the layers the VPS train layout gives the stage.

The stage keeps the HF parameter names (`model.layers.<i>.*` with the global layer index, `model.embed_tokens.weight`
on the first stage, `model.norm.weight` and `lm_head.weight` / `value_head.*` on the last), so the VPS layout's
buffers and the live parameters are the same names. A tied embedding is two Parameters across stages: the first
stage's `model.embed_tokens.weight` and the last stage's `lm_head.weight` (vps.train_layout.live_names); the
engine sums their gradients so both stay equal. Which layers a stage owns is `vps.validate.stage_layers`, the rule
the VPS layout uses, and nothing else.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from rlhf_dyna.vps.spec import ParallelSpec
from rlhf_dyna.vps.validate import stage_layers

# Reads the last stage's head output into what the schedule carries back (log-probs, values): [mb, T] float32.
HeadReader = Callable[[Tensor, Tensor], Tensor]


class StageModule(nn.Module):
    """forward(x, attention_mask, position_ids[, labels]): x is input_ids on the first stage, hidden states after it.
    The last stage returns the head's output ([mb, T, V] logits or [mb, T] values), or `reader(head, labels)`
    when a reader is set (forward-only log-probs: the schedule then carries [mb, T] instead of the logits). With
    `logits_to_keep` K > 0 the LM head runs on the last K positions only ([mb, K, V], as HF's forward does)."""

    def __init__(self, hf_model: nn.Module, stage: int, num_stages: int, layers: tuple[int, int]) -> None:
        super().__init__()
        self.config = hf_model.config
        self.stage, self.num_stages, self.layer_range = stage, num_stages, layers
        self.head_name = "lm_head" if hasattr(hf_model, "lm_head") else "value_head"
        self.source_class = type(hf_model)  # relayout rebuilds the whole model on meta before splitting it again
        self.model = hf_model.model
        lo, hi = layers
        self.model.layers = nn.ModuleDict({str(i): self.model.layers[i] for i in range(lo, hi)})
        if not self.is_first:
            self.model.embed_tokens = None
        if self.is_last:
            setattr(self, self.head_name, getattr(hf_model, self.head_name))  # a tied lm_head keeps the embedding values
        else:
            self.model.norm = None
        self.reader: HeadReader | None = None
        self.logits_to_keep = 0

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    def _masks(self, hidden: Tensor, attention_mask: Tensor, position_ids: Tensor) -> dict[str, Tensor | None]:
        """The masks HF's own decoder builds (full, and sliding-window where the config has such layers)."""
        kwargs = dict(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask, past_key_values=None,
                      position_ids=position_ids)
        masks = {"full_attention": create_causal_mask(**kwargs)}
        if "sliding_attention" in (getattr(self.config, "layer_types", None) or ()):
            masks["sliding_attention"] = create_sliding_window_causal_mask(**kwargs)
        return masks

    def forward(self, x: Tensor, attention_mask: Tensor, position_ids: Tensor, labels: Tensor | None = None) -> Tensor:
        hidden = self.model.embed_tokens(x) if self.is_first else x
        masks = self._masks(hidden, attention_mask, position_ids)
        position_embeddings = self.model.rotary_emb(hidden, position_ids=position_ids)
        layer_types = getattr(self.config, "layer_types", None)
        for index, layer in self.model.layers.items():
            kind = layer_types[int(index)] if layer_types else "full_attention"
            hidden = layer(hidden, attention_mask=masks[kind], position_embeddings=position_embeddings,
                           position_ids=position_ids, past_key_values=None, use_cache=False)
        if not self.is_last:
            return hidden
        hidden = self.model.norm(hidden)
        if self.head_name == "lm_head":
            head = self.lm_head(hidden[:, -self.logits_to_keep:] if self.logits_to_keep else hidden)
        else:
            head = self.value_head(hidden).squeeze(-1)
        return head if self.reader is None else self.reader(head, labels)


def split_stage(hf_model: nn.Module, spec: ParallelSpec, stage: int) -> StageModule:
    """`hf_model` (real or on meta) cut down to pipeline stage `stage` of `spec`, by the VPS layer ranges."""
    ranges = stage_layers(spec, hf_model.config.num_hidden_layers)
    return StageModule(hf_model, stage, spec.pp, ranges[stage])


def bubble_fraction(num_stages: int, num_microbatches: int) -> float:
    """Idle share of a GPipe / 1F1B step with equal stage times: (p - 1) / (m + p - 1)."""
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


def meta_full_model(stage_module: StageModule) -> nn.Module:
    """The unsplit architecture on the meta device (what relayout builds a new layout from)."""
    from rlhf_dyna.models.build import ValueModel

    cls = stage_module.source_class
    with torch.device("meta"):
        if cls is ValueModel:
            return ValueModel(stage_module.config, next(stage_module.parameters()).dtype)
        return cls(stage_module.config)
