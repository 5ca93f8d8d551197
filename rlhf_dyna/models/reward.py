"""Reward models: HF sequence classifiers with one label (`AutoModelForSequenceClassification`), the backbone at
`.model` with the same names as in the causal LM, and a bias-free `score` head in place of `lm_head`.

transformers scores a sequence with the head's value at its rightmost token that is not `config.pad_token_id`; the
engine runs the same forward, so a right-padded batch gets the scores the model gives each text alone.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import AutoModelForSequenceClassification, PretrainedConfig

from .architectures import architecture
from .reward_catalog import SCORE_HEAD


def classifier_class(model_type: str) -> str:
    """The sequence-classification class transformers builds for an architecture: LlamaForCausalLM -> Llama...."""
    return architecture(model_type).causal_lm.removesuffix("ForCausalLM") + "ForSequenceClassification"


def reward_config(causal: PretrainedConfig, pad_token_id: int) -> PretrainedConfig:
    """A one-label sequence classifier's config from a causal LM's: same backbone, padding id set (transformers
    finds each row's last token by it)."""
    config = copy.deepcopy(causal)
    config.num_labels = 1
    config.architectures = [classifier_class(config.model_type)]
    config.pad_token_id = pad_token_id
    return config


def is_reward_model(model: nn.Module) -> bool:
    return isinstance(getattr(model, SCORE_HEAD, None), nn.Linear)


def meta_reward_model(config: PretrainedConfig, dtype: torch.dtype) -> nn.Module:
    with torch.device("meta"):
        return AutoModelForSequenceClassification.from_config(config, dtype=dtype, attn_implementation="sdpa")


def score_head_init(config: PretrainedConfig, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    """A fresh score head for a classifier trained from a causal LM (not in its checkpoint): N(0, initializer_range),
    seeded, as transformers initialises it."""
    generator = torch.Generator().manual_seed(seed)
    std = getattr(config, "initializer_range", 0.02)
    weight = torch.randn((config.num_labels, config.hidden_size), generator=generator, dtype=torch.float32) * std
    return {f"{SCORE_HEAD}.weight": weight.to(dtype)}
