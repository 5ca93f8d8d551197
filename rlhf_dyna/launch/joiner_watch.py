"""The joiners' deaths as the launcher sees them (docs/elastic/faults.md): a joining process that dies before the world admits
it is dropped (the world goes on without it, and the launcher says so); one that dies after is a lost rank of the new
world (survived from the replicas or a checkpoint where the run keeps them, else the run stops).

The launcher knows the exits of the joiners it started (elastic.events join@S). An elastic.join=RUN_DIR process is not
its child: it announces its pid on the job's store, and the launcher looks for it in /proc (the job's processes run on
this host). Either way the joiner's fate on the job's store decides (elastic.join_world: set once, "gone" here or
"admitted" by rank 0 at the boundary), so a death and an admission at the same moment cannot both win."""
from __future__ import annotations

import sys
from pathlib import Path

POLL_S = 0.25  # how often the elastic.join processes are looked for


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


class JoinerWatch:
    """spawn_ranks' view of the joiners: `world_size` ranks launched, then the scripted joiners; the job's store at
    127.0.0.1:`port`."""

    def __init__(self, world_size: int, port: int) -> None:
        self.world_size, self.port, self.store = world_size, port, None
        self.requests_done = 0  # elastic.join requests below this number are settled (dead, done or never admitted)
        self.ended: set[str] = set()  # requests past that number already settled

    def _store(self):
        if self.store is None:
            from rlhf_dyna.elastic.join_world import job_client_store  # the launcher's refusals need no torch
            self.store = job_client_store("127.0.0.1", self.port)
        return self.store

    def launched_exit(self, process: int, code: int) -> str | None:
        """Launched joiner `process` exited with error `code`: its name where it was a rank of the world (a lost rank),
        None where it never entered (dropped, with a line saying so; or refused)."""
        from rlhf_dyna.elastic.join_world import joiner_name
        name = joiner_name(process - self.world_size)
        return name if self._fell(name, f"{name} (process {process}) exited with code {code}") else None

    def poll(self) -> list[str]:
        """The elastic.join processes found dead since the last look that were ranks of the world (lost ranks); those
        that died before their admission are dropped, with a line each."""
        from rlhf_dyna.elastic.join_world import announced_pid, has_exited, request, requests_so_far
        store, lost = self._store(), []
        for n in range(self.requests_done, requests_so_far(store)):
            name = request(n)
            pid = announced_pid(store, name)
            if name in self.ended or pid is None or alive(pid):
                continue
            self.ended.add(name)
            if not has_exited(store, name) and self._fell(name, f"{name} (pid {pid}) died"):
                lost.append(name)
        while request(self.requests_done) in self.ended:
            self.ended.discard(request(self.requests_done))
            self.requests_done += 1
        return lost

    def _fell(self, name: str, what: str) -> bool:
        """Joiner `name` died (`what`): True where it had been admitted; else it is dropped (or had been refused)."""
        from rlhf_dyna.elastic.join_world import drop, is_refused
        store = self._store()
        if is_refused(store, name):
            return False
        if drop(store, name):
            print(f"rlhf_dyna: {what} before the world admitted it; the run goes on without it", file=sys.stderr,
                  flush=True)
            return False
        return True
