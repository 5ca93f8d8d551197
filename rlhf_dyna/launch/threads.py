"""Worker threads of a rank that allocate on its GPU, and engines stopped on a thread that a move can wait for.

CUDA's current device belongs to a thread: a new thread starts on device 0, whatever the rank's main thread chose
(`torch.cuda.set_device` there). Anything a worker thread builds would land on GPU 0 (TrainEngine records
`torch.cuda.current_device()`, FSDP2 too), so every worker thread of a CUDA rank starts with the device of the thread
that created it (`DeviceThread`). A CPU rank's threads touch nothing of CUDA.

A leaving rollout engine is stopped on such a thread (`EngineStop`): vLLM's shutdown waits seconds for its engine
process to exit. On the CPU a move need not wait for it; on a GPU the engine's memory is only free once its process
has exited, so a move joins the stop before anything of the next layout allocates (`joins_before_move`).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch


def current_cuda_index() -> int | None:
    """This thread's CUDA device, or None where the process never initialised CUDA (a CPU rank: no CUDA call)."""
    return torch.cuda.current_device() if torch.cuda.is_initialized() else None


def joins_before_move(device_type: str) -> bool:
    """Whether a leaving engine must be gone before the move allocates: on a GPU its memory is what the move needs."""
    return device_type == "cuda"


class DeviceThread(threading.Thread):
    """A thread whose current CUDA device is its creator's (`device_index`; None: a CPU rank, nothing is set).
    `set_device` is torch's, replaceable in a unit test."""

    def __init__(self, target: Callable[[], None], name: str, device_index: int | None = None,
                 set_device: Callable[[int], None] = torch.cuda.set_device, daemon: bool = True) -> None:
        super().__init__(target=target, name=name, daemon=daemon)
        self.device_index = current_cuda_index() if device_index is None else device_index
        self._set_device = set_device

    def run(self) -> None:
        if self.device_index is not None:
            self._set_device(self.device_index)
        super().run()


class EngineStop:
    """`engine.shutdown()` on a DeviceThread, started at once; `join` waits for it and raises what it raised."""

    def __init__(self, engine, on_stopped: Callable[[float, float], None] | None = None,
                 device_index: int | None = None) -> None:
        """`on_stopped(wall start, seconds)` runs on the thread once the engine is down (a trace event)."""
        self.error: BaseException | None = None
        self._engine, self._on_stopped = engine, on_stopped
        self.thread = DeviceThread(self._stop, "rlhf_dyna-engine-stop", device_index)
        self.thread.start()

    def _stop(self) -> None:
        wall, t = time.time(), time.perf_counter()
        try:
            self._engine.shutdown()  # local: its engine process (and its GPU memory) and its shm file
        except BaseException as err:  # surfaced by join, on the caller's thread
            self.error = err
            return
        finally:
            self._engine = None
        if self._on_stopped is not None:
            self._on_stopped(wall, time.perf_counter() - t)

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"a rollout engine did not shut down within {timeout} s")
        if self.error is not None:
            raise RuntimeError(f"shutting a rollout engine down failed: {self.error}") from self.error
