"""Build HF policy / value models from a typed spec or a local checkpoint dir, and save them for vLLM."""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import ModelOutput

from .hf_config import ModelSpec, make_hf_config
from .moe_weights import to_checkpoint_names
from .value_catalog import VALUE_HEAD

WEIGHTS_FILE = "model.safetensors"


def _resolve_config(spec_or_path: ModelSpec | str | Path) -> tuple[PretrainedConfig, Path | None]:
    if isinstance(spec_or_path, ModelSpec):
        return make_hf_config(spec_or_path), None
    path = Path(spec_or_path)
    return AutoConfig.from_pretrained(path), path


def build_policy(spec_or_path: ModelSpec | str | Path, dtype: torch.dtype = torch.float32, seed: int = 0) -> PreTrainedModel:
    """Causal LM: random init (seeded) from a spec, or loaded from a local safetensors dir."""
    config, path = _resolve_config(spec_or_path)
    if path is not None:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")


@dataclass
class ValueOutput(ModelOutput):
    values: Tensor | None = None  # [batch, seq]: value head applied to the hidden state at each position


class ValueModel(nn.Module):
    """Decoder backbone (`.model`, same names as in the causal LM) plus a scalar value head."""

    def __init__(self, config: PretrainedConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.model = AutoModel.from_config(config, dtype=dtype, attn_implementation="sdpa")
        self.value_head = nn.Linear(config.hidden_size, 1, dtype=dtype)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None, **kwargs) -> ValueOutput:
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs).last_hidden_state
        return ValueOutput(values=self.value_head(hidden).squeeze(-1))


def build_critic(spec_or_path: ModelSpec | str | Path, dtype: torch.dtype = torch.float32, seed: int = 0) -> ValueModel:
    """Value model: random init, or backbone (and value head, if saved) from a local checkpoint dir.

    A policy checkpoint initialises the backbone; its lm_head is ignored and the head stays random."""
    config, path = _resolve_config(spec_or_path)
    torch.manual_seed(seed)
    critic = ValueModel(config, dtype)
    if path is not None:
        state = load_file(str(path / WEIGHTS_FILE))
        missing, _unexpected = critic.load_state_dict(state, strict=False)
        missing_backbone = [name for name in missing if not name.startswith(VALUE_HEAD)]
        if missing_backbone:
            raise ValueError(f"{path / WEIGHTS_FILE} lacks backbone weights {missing_backbone[:5]}")
    return critic


def save_hf_dir(
    weights: nn.Module | Iterable[tuple[str, Tensor]],
    config: PretrainedConfig,
    out_dir: str | Path,
    tokenizer_json: str | None = None,
) -> Path:
    """Write config.json + model.safetensors (+ tokenizer.json) so that HF and vLLM can open the dir.

    `weights` is a module (unsharded) or (HF name, full tensor) pairs, e.g. from `train.full_state_dict`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pairs = weights.state_dict().items() if isinstance(weights, nn.Module) else weights
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in to_checkpoint_names(pairs)}
    if getattr(config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)  # safetensors refuses shared storage; HF and vLLM re-tie on load
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    config.save_pretrained(out)
    if tokenizer_json is not None:
        json.loads(tokenizer_json)  # fail here, not inside vLLM, if it is not JSON
        (out / "tokenizer.json").write_text(tokenizer_json)
    return out
