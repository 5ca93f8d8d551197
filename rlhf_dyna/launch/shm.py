"""vLLM's CPU shared-memory segments in /dev/shm: named after the run, removed when it ends, and not used for TP where
a run must survive a lost rank (vllm_tp_over_gloo)."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

SHM_DIR = Path("/dev/shm")
_VLLM_CPU_COMM = "vllm.distributed.device_communicators.cpu_communicator"


def run_ident() -> str:
    """The run's name for its /dev/shm segments: VLLM_DIST_IDENT as the launcher set it, else the (host-unique) master
    port; the launcher removes `<ident>-*` when the run ends."""
    return os.environ.get("VLLM_DIST_IDENT") or f"rlhfdyna-{os.environ.get('MASTER_PORT', os.getpid())}"


def run_segments(run_ident: str) -> list[Path]:
    """The run's vLLM CPU segments: `<ident>-<group>-[<ranks>]-cpushm_<rank>` (see pin_vllm_shm_ident)."""
    if not SHM_DIR.is_dir():
        return []
    return sorted(p for p in SHM_DIR.iterdir() if p.name.startswith(f"{run_ident}-"))


def clean_shm_segments(run_ident: str, extra: list[Path] | tuple[Path, ...] = ()) -> list[str]:
    """Unlink the run's named segments and `extra` ones; returns the names removed."""
    removed = []
    for path in [*run_segments(run_ident), *extra]:
        try:
            path.unlink()
            removed.append(path.name)
        except FileNotFoundError:
            pass
    return removed


_pinned_ident = ""  # read by the patched make_group_name at call time, so re-pinning needs no re-patching
_tp_over_gloo = False  # read by the patched shm check at call time (vllm_tp_over_gloo)


def vllm_tp_over_gloo(enabled: bool) -> None:
    """`enabled`: vLLM's CPU TP (and PP) groups reduce through torch.distributed (gloo) instead of its shared-memory
    ring, which spins on a dead peer's stamps in memory with no timeout and no abort, where the loss watchdog's socket
    shutdown (launch/sockets.py) cannot reach it; runs that survive a lost rank with rollout.tp > 1 take gloo."""
    global _tp_over_gloo
    _tp_over_gloo = enabled


def _shm_unless_gloo(module: ModuleType) -> None:
    """vLLM takes its shm ring only where every rank of the group names one segment group; under vllm_tp_over_gloo
    none does, so it logs "CPU SHM communicator disabled" and falls back to torch.distributed (every rank alike)."""
    comm = getattr(module, "CpuCommunicator", None)
    if comm is None or getattr(comm._all_group_ranks_share_shm_group_name, "pinned_by_rlhf_dyna", False):
        return
    shared = comm._all_group_ranks_share_shm_group_name

    def shared_unless_gloo(self: object) -> bool:
        if not _tp_over_gloo:
            return shared(self)
        print(f"rlhf_dyna: vLLM's {getattr(self, 'unique_name', '?')} group reduces over gloo, not its shm ring (a lost "
              "peer must not hang the survivors)", flush=True)
        return False

    shared_unless_gloo.pinned_by_rlhf_dyna = True  # type: ignore[attr-defined]
    comm._all_group_ranks_share_shm_group_name = shared_unless_gloo


def _pin_module(module: ModuleType) -> None:
    _shm_unless_gloo(module)
    shm_dist = getattr(module, "_CPUSHMDistributed", None)
    if shm_dist is None or getattr(shm_dist.make_group_name, "pinned_by_rlhf_dyna", False):
        return
    make_group_name = shm_dist.make_group_name

    def pinned_make_group_name(communicator: object) -> str:
        os.environ["VLLM_DIST_IDENT"] = _pinned_ident
        return make_group_name(communicator)

    pinned_make_group_name.pinned_by_rlhf_dyna = True  # type: ignore[attr-defined]
    shm_dist.make_group_name = staticmethod(pinned_make_group_name)


class _PinOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name != _VLLM_CPU_COMM:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_pin(module: ModuleType) -> None:
            exec_module(module)
            _pin_module(module)

        spec.loader.exec_module = exec_and_pin  # type: ignore[method-assign]
        return spec


def pin_vllm_shm_ident(run_ident: str) -> None:
    """Make vLLM name its CPU shm segments after this run.

    vLLM's CPU worker overwrites VLLM_DIST_IDENT with '//' under external_launcher, so every
    run would share the names `-tp:0-[0-1]-cpushm_<r>` and a crashed run would break the next
    (errno 17). We set it back right where the names are made; applied lazily on import so
    ranks that never use vLLM don't pay for importing it.
    """
    global _pinned_ident
    _pinned_ident = run_ident
    os.environ["VLLM_DIST_IDENT"] = run_ident
    module = sys.modules.get(_VLLM_CPU_COMM)
    if module is not None:
        _pin_module(module)
    elif not any(isinstance(f, _PinOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PinOnImport())
