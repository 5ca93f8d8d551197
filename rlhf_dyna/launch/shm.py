"""vLLM's CPU shared-memory segments in /dev/shm: named after the run, and removed when it ends."""
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


def _pin_module(module: ModuleType) -> None:
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
