"""Model catalogs as VPS sees them: logical tensors with a structural role, no weights, no torch."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .tensor import Kind, LogicalTensor


class Role(str, Enum):
    """What a tensor is in the architecture; layouts shard by role."""

    EMBED = "embed"
    LM_HEAD = "lm_head"
    FINAL_NORM = "final_norm"
    ATTN_NORM = "attn_norm"
    MLP_NORM = "mlp_norm"
    Q = "q"
    K = "k"
    V = "v"
    O = "o"
    Q_BIAS = "q_bias"
    K_BIAS = "k_bias"
    V_BIAS = "v_bias"
    Q_NORM = "q_norm"
    K_NORM = "k_norm"
    GATE = "gate"
    UP = "up"
    DOWN = "down"
    ROUTER = "router"
    EXPERT_GATE = "expert_gate"  # stacked over experts: [E, I, H]
    EXPERT_UP = "expert_up"  # [E, I, H]
    EXPERT_DOWN = "expert_down"  # [E, H, I]


EXPERT_ROLES = frozenset({Role.EXPERT_GATE, Role.EXPERT_UP, Role.EXPERT_DOWN})  # an MoE layer's experts


@dataclass(frozen=True)
class ModelDims:
    """The numbers of an architecture that decide shapes and valid parallel sizes."""

    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width (0 if every layer is MoE)
    vocab: int
    tied_embeddings: bool = False
    num_experts: int = 0
    moe_intermediate: int = 0
    moe_layers: tuple[int, ...] = ()  # layer indices whose MLP is a mixture of experts


@dataclass(frozen=True)
class CatalogTensor:
    """One logical tensor of the checkpoint (all experts of a layer stacked into one tensor)."""

    name: str  # HF checkpoint name; stacked experts: model.layers.L.mlp.experts.gate_proj.weight
    role: Role
    layer: int | None  # decoder layer index; None for embeddings, final norm, lm_head
    shape: tuple[int, ...]
    train_name: str = ""  # parameter of the training module holding it ("" = same as name)
    rollout_name: str = ""  # vLLM parameter holding it, fused ones included ("" = same as name)

    @property
    def train_buffer(self) -> str:
        return self.train_name or self.name

    @property
    def rollout_buffer(self) -> str:
        return self.rollout_name or self.name


@dataclass(frozen=True)
class ModelCatalog:
    """All logical tensors of one model, for every state kind, from its config alone."""

    arch: str
    dims: ModelDims
    tensors: tuple[CatalogTensor, ...]
    param_dtype: str = "bfloat16"
    state_dtype: str = "float32"  # master weights and Adam moments
    _by_name: dict[str, CatalogTensor] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name.update({t.name: t for t in self.tensors})

    def __getitem__(self, name: str) -> CatalogTensor:
        return self._by_name[name]

    def dtype(self, kind: Kind) -> str:
        return self.param_dtype if kind in (Kind.PARAM, Kind.GRAD) else self.state_dtype

    def logical(self, t: CatalogTensor, kind: Kind) -> LogicalTensor:
        return LogicalTensor(t.name, kind, t.shape, self.dtype(kind))

    def numel(self) -> int:
        total = 0
        for t in self.tensors:
            n = 1
            for s in t.shape:
                n *= s
            total += n
        return total


def expert_checkpoint_name(stacked_name: str, expert: int) -> str:
    """Per-expert HF checkpoint name of expert `expert` in a stacked expert tensor (its box [e:e+1])."""
    head, proj = stacked_name.rsplit(".experts.", 1)
    return f"{head}.experts.{expert}.{proj}"
