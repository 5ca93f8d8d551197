"""The job's TCPStore, served from the launcher's process (launch/spawn.py), as torchrun's agent serves its agent
store: the ranks (env:// with TORCHELASTIC_USE_AGENT_STORE=True), the joiners and every `elastic.join=RUN_DIR`
process are its clients, so no rank's process holds it and any rank may leave the job (docs/elastic/leave.md).

The launcher starts it after forking the ranks: its server is a thread, and a process forked while a thread runs may
inherit a lock that thread held (launch/fork.py forks from a launcher without threads). The ranks connect to the
port they were given at the fork; a client retries its connect until the server is up."""
from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

STORE_TIMEOUT = timedelta(minutes=30)  # torch's default for a rendezvous store


def serve_job_store(port: int) -> dist.TCPStore:
    """The job's store server on `port` of this machine (the ranks' MASTER_PORT)."""
    return dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT)
