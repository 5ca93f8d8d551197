"""The loss watchdog (orchestrator/loss_watchdog.py) in a process of its own, against a real TCPStore: blocked in the
store's wait, it wakes when the launcher's announcement of a lost rank is set, hands it to the main thread, waits for
the next one after `rearm`, and a process that starts after an announcement skips it. In a subprocess: on waking the
watchdog shuts every TCP connection of its process but the store's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

BODY = r"""
import json, os, time
import torch.distributed as dist
from rlhf_dyna.elastic.join_world import job_client_store
from rlhf_dyna.launch.lost_ranks import lost_key
from rlhf_dyna.orchestrator.loss_watchdog import Watchdog

server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(server.port))
launcher = job_client_store()
watchdog = Watchdog()
out = {"quiet": watchdog.wait(0.3)}
time.sleep(0.2)
launcher.set(lost_key(1), json.dumps({"lost": [2]}))
began = time.monotonic()
out["first"] = watchdog.wait(5.0)
out["first_after"] = time.monotonic() - began
watchdog.rearm()
out["before_second"] = watchdog.wait(0.3)
launcher.set(lost_key(2), json.dumps({"lost": [1]}))
out["second"] = watchdog.wait(5.0)
late = Watchdog()  # started after both announcements: waits for a third
out["late_generation"] = late.generation
out["late"] = late.wait(0.3)
watchdog.close()
late.close()
print("RESULT " + json.dumps(out), flush=True)
os._exit(0)  # the watchdogs' threads stay blocked in the store's wait; the process ends with them
"""


def test_the_watchdog_wakes_on_each_announcement_and_a_late_one_skips_those_before_it():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", BODY], env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    out = json.loads(lines[0].removeprefix("RESULT "))
    assert out["quiet"] is None and out["before_second"] is None and out["late"] is None, out
    assert out["first"] == {"lost": [2]} and out["second"] == {"lost": [1]}, out
    assert out["first_after"] < 2.0, out
    assert out["late_generation"] == 2, out
