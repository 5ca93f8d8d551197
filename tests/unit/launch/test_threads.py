"""Worker threads take their rank's device before they run; a leaving engine's stop can be joined (launch/threads.py).

CUDA is absent here: `set_device` is a recorder in place of torch's, which is what a CUDA rank's thread would call."""
from __future__ import annotations

import threading
import time

import pytest

from rlhf_dyna.launch.threads import DeviceThread, EngineStop, current_cuda_index, joins_before_move


def test_a_worker_thread_sets_the_ranks_device_before_its_work() -> None:
    seen: list[tuple[str, object]] = []
    thread = DeviceThread(lambda: seen.append(("work", threading.get_ident())), "test-worker", device_index=3,
                          set_device=lambda index: seen.append(("set_device", (index, threading.get_ident()))))
    thread.start()
    thread.join()
    assert seen == [("set_device", (3, thread.ident)), ("work", thread.ident)]


def test_a_cpu_ranks_thread_touches_no_device() -> None:
    assert current_cuda_index() is None  # this process never initialised CUDA
    calls: list[int] = []
    thread = DeviceThread(lambda: None, "test-worker", set_device=calls.append)
    thread.start()
    thread.join()
    assert calls == []


class SlowEngine:
    def __init__(self, seconds: float, fail: bool = False) -> None:
        self.seconds, self.fail, self.down = seconds, fail, False

    def shutdown(self) -> None:
        time.sleep(self.seconds)
        if self.fail:
            raise RuntimeError("engine process would not exit")
        self.down = True


def test_join_returns_once_the_engine_is_down() -> None:
    engine, stopped = SlowEngine(0.3), []
    stop = EngineStop(engine, on_stopped=lambda wall, seconds: stopped.append(seconds))
    assert not engine.down  # the stop runs on its thread: the caller goes on
    stop.join(timeout=10)
    assert engine.down and len(stopped) == 1 and stopped[0] >= 0.3


def test_a_failed_stop_is_raised_on_join() -> None:
    stop = EngineStop(SlowEngine(0.0, fail=True))
    with pytest.raises(RuntimeError, match="would not exit"):
        stop.join(timeout=10)


def test_only_a_gpu_move_waits_for_the_leaving_engine() -> None:
    assert joins_before_move("cuda") and not joins_before_move("cpu")
