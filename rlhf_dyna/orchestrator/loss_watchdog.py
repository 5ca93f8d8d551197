"""The thread that waits for the launcher's announcement of lost ranks (launch/lost_ranks.py) and shuts the old world's
connections (launch/sockets.py), so that a rank blocked in a collective gets out at once (orchestrator/recovery.py)."""
from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta

from ..elastic.join_world import job_client_store
from ..launch.lost_ranks import lost_key
from ..launch.sockets import shut_connections

POLL_S = 0.05  # while an announcement is being handled, and after an error of the store
WAIT = timedelta(days=1)  # a blocking wait for the next announcement: the store wakes the thread, no polling


class Watchdog:
    """A thread that waits for the launcher's announcement of lost ranks and shuts the old world's connections."""

    def __init__(self) -> None:
        self.store = job_client_store()  # its own client: the main thread's may be blocked
        self.generation = 0  # announcements seen; a process that joined later skips those made before it
        while self.store.check([lost_key(self.generation + 1)]):
            self.generation += 1
        self.announced = threading.Event()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True, name="rlhf_dyna-loss-watchdog")
        self.thread.start()

    def _watch(self) -> None:
        # blocked in the store's wait, the GIL released: polling woke 4 ranks' threads 20 times a second beside the step
        while not self.stopped.is_set():
            if self.announced.is_set():
                time.sleep(POLL_S)
                continue
            try:
                self.store.wait([lost_key(self.generation + 1)], WAIT)
            except Exception:  # noqa: BLE001 - the run's end (the store gone) or a day without a loss: look again
                time.sleep(POLL_S)
                continue
            if self.stopped.is_set():
                return
            try:
                shut_connections({int(os.environ["MASTER_PORT"])})
            finally:  # the main thread goes on whatever happened here
                self.announced.set()

    def wait(self, timeout: float) -> dict | None:
        """The next announcement (after this rank's old-world connections are shut), or None by `timeout`."""
        if not self.announced.wait(timeout):
            return None
        self.generation += 1
        return json.loads(self.store.get(lost_key(self.generation)))

    def rearm(self) -> None:
        self.announced.clear()

    def close(self) -> None:
        self.stopped.set()
