"""Logical tensors: one global shape per (HF name, state kind), independent of any parallelism."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from math import prod

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "uint8": 1}


class Kind(str, Enum):
    PARAM = "param"
    GRAD = "grad"
    MASTER = "master"
    EXP_AVG = "exp_avg"
    EXP_AVG_SQ = "exp_avg_sq"


@dataclass(frozen=True, slots=True)
class LogicalTensor:
    name: str  # HF checkpoint name, e.g. model.layers.3.self_attn.q_proj.weight
    kind: Kind
    shape: tuple[int, ...]
    dtype: str  # key of DTYPE_BYTES

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def key(self) -> tuple[str, Kind]:
        return (self.name, self.kind)
