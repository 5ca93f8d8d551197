"""The runtime of each placement policy, by name: a new policy is a `Runtime` subclass in a file of its own and one
entry here (or `register_runtime` before the loop starts)."""
from __future__ import annotations

from .base import Runtime
from .colocate import ColocateRuntime
from .lend import LendRuntime
from .rebalance import RebalanceRuntime
from .split import SplitRuntime

RUNTIMES: dict[str, type[Runtime]] = {cls.name: cls for cls in (ColocateRuntime, LendRuntime, SplitRuntime,
                                                                  RebalanceRuntime)}


def register_runtime(cls: type[Runtime]) -> type[Runtime]:
    RUNTIMES[cls.name] = cls
    return cls


def runtime_name(placement) -> str:
    """placement.policy, or "rebalance" for a split whose sets change size (placement.rebalance=true)."""
    return "rebalance" if placement.rebalance else placement.policy
