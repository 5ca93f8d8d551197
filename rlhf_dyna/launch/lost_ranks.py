"""The launcher's side of surviving a lost rank (elastic.replicas=1 or elastic.recover_from_checkpoint; docs/elastic/recovery.md,
"Detection").

When a rank's process dies, `spawn_ranks` does not stop the run at once: it waits a moment for other deaths of the
same failure (a node's ranks die together), then decides. Recoverable (a survivor left, the survivors of the previous
recovery done with it, and every lost piece either held by a surviving replica or, where checkpoint recovery is on,
in a complete checkpoint on disk; rank 0 too: the store is this process's, and the first survivor takes over the run's
metrics): it tells the survivors on the job's store,

    lost/<generation> = {"lost": [ranks of the current world], "world_size": W, "source": "replicas" | "checkpoint",
                         "died_at": unix time}

and the survivors (orchestrator/recovery.py) rebuild the state in a world without them. Otherwise it stops the run,
naming the lost ranks and what was lost. Ranks are numbered in the current world, as the ranks publish it on the job's
store (launch/world_record.py), read before each decision: a scripted leaver is no member once the new world is
published, joiners are members from their admission. A rank lost while the world changes (a leave marked, or a joiner
admitted and not yet listed) stops the run: no world holds a consistent state then.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlhf_dyna.elastic.replicas import holder_of, unrecoverable
from rlhf_dyna.orchestrator.checkpoint_dirs import scan

from .world_record import WorldRecord, read_world, replace_world

LOST_KEY = "lost/{}"  # on the job's store (elastic.join_world.job_client_store), generation 1, 2, ...
RECOVERED_KEY = "recovered/{}"  # set by rank 0 of the new world once its recovery is done
SETTLE_S = 0.5  # deaths this close together are one failure (a node's ranks), decided together


def lost_key(generation: int) -> str:
    return LOST_KEY.format(generation)


def recovered_key(generation: int) -> str:
    return RECOVERED_KEY.format(generation)


@dataclass
class LossWatch:
    """Which launched processes form the current world, and what to do when some of them die."""

    world_size: int
    replicas: bool = True  # elastic.replicas=1: each rank's pieces also on the next rank
    checkpoints: Path | None = None  # where complete checkpoints are loaded from in place; None: checkpoint recovery off
    members: list[int | str] = field(default_factory=list)  # each rank's launch index, or its elastic.join name
    generation: int = 0  # recoveries announced so far

    def __post_init__(self) -> None:
        self.members = list(range(self.world_size))

    def decide(self, dead: list[int], recovered_before: bool) -> tuple[dict | None, str | None]:
        """For the processes `dead` (launch indices, all members): (the announcement to write, None) where the
        survivors can recover, else (None, why the run stops). `recovered_before`: the previous recovery finished."""
        world = len(self.members)
        ranks = sorted(self.members.index(p) for p in dead)
        named = ", ".join(f"rank {r} (process {self.members[r]})" for r in ranks)
        if not recovered_before:
            return None, (f"{named} of {world} lost while the survivors were still recovering from the previous "
                          f"loss: a failure during recovery stops the run. Resume it with trainer.resume=auto.")
        if world - len(ranks) < 1:
            return None, f"{named}: every rank lost. Resume the run with trainer.resume=auto."
        verdict = {"lost": ranks, "world_size": world, "processes": [self.members[r] for r in ranks]}
        gone = unrecoverable(tuple(ranks), world) if self.replicas else tuple(ranks)
        if not gone:
            return {**verdict, "source": "replicas"}, None
        if self.checkpoints is not None and scan(self.checkpoints)[0]:
            return {**verdict, "source": "checkpoint"}, None
        pieces = "; ".join(f"rank {r}'s shard of every training role's state ("
                           + (f"its replica was on rank {holder_of(r, world)}, lost too)" if self.replicas else
                              "elastic.replicas=0: no replica)") for r in gone)
        fallback = (f"no complete checkpoint is under {self.checkpoints} to load in place" if self.checkpoints is not None
                    else "loading a checkpoint in place is off (elastic.recover_from_checkpoint=false)")
        return None, (f"{named} of {world} lost{' at once' if len(ranks) > 1 else ''}: {pieces}. Nothing in host memory holds those pieces, and "
                      f"{fallback}: stopped the run. Resume it with trainer.resume=auto.")

    def announce(self, store, verdict: dict, died_at: float) -> int:
        """Write the announcement of the next generation; the members are the survivors from now on."""
        self.generation += 1
        store.set(lost_key(self.generation), json.dumps({**verdict, "died_at": died_at}))
        self.members = [p for i, p in enumerate(self.members) if i not in set(verdict["lost"])]
        return self.generation

    def recovered(self, store) -> bool:
        return self.generation == 0 or store.check([recovered_key(self.generation)])


def settle(first: tuple[int, float], more) -> list[tuple[int, float]]:
    """The first death and those that follow within SETTLE_S (`more(timeout)`: the next (process, when) or None)."""
    deaths, deadline = [first], time.monotonic() + SETTLE_S
    while (left := deadline - time.monotonic()) > 0:
        nxt = more(left)
        if nxt is not None:
            deaths.append(nxt)
    return deaths


class LossHandler:
    """spawn_ranks' hook: decides on each failure of `world_size` ranks and tells the survivors (the job's store at
    127.0.0.1:`port`); `stop_reason` says why the run must stop."""

    def __init__(self, world_size: int, port: int, replicas: bool = True, checkpoints: Path | None = None) -> None:
        self.watch, self.port, self.store = LossWatch(world_size, replicas, checkpoints), port, None
        self.lost_processes: set[int] = set()

    def _store(self):
        if self.store is None:
            # deferred: the launcher's refusals and plain runs need not import torch.distributed
            from rlhf_dyna.elastic.join_world import job_client_store
            self.store = job_client_store("127.0.0.1", self.port)
        return self.store

    def on_deaths(self, dead: list, died_at: float) -> str | None:
        """`dead`: launched processes (or elastic.join names) that exited with an error; None if the survivors recover
        (or none of them was a rank of the current world), else why to stop."""
        try:
            store = self._store()
            for _ in range(3):  # the ranks may move the world between our read and our write: decide again
                record, raw = read_world(store, self.watch.world_size)
                why = self.changing(store, record, dead)
                if why is not None:
                    return why
                self.watch.members = record.members
                members = [p for p in dead if p in record.members]
                if not members:
                    return None
                verdict, why = self.watch.decide(members, self.watch.recovered(store))
                if why is not None:
                    return why
                survivors = [p for i, p in enumerate(record.members) if i not in set(verdict["lost"])]
                if replace_world(store, raw, WorldRecord(record.n + 1, survivors)):
                    break
            else:
                return f"processes {dead} lost while the world kept changing; stopped the run."
            generation = self.watch.announce(store, verdict, died_at)
        except Exception as err:  # the store (this process's server) does not answer
            return f"processes {dead} lost and the job's store does not answer ({err}); stopped the run."
        self.lost_processes.update(members)
        ranks = ", ".join(str(r) for r in verdict["lost"])
        source = "the replicas" if verdict["source"] == "replicas" else "the newest complete checkpoint"
        print(f"rlhf_dyna: rank {ranks} of {verdict['world_size']} lost (process {', '.join(map(str, members))}); the "
              f"survivors rebuild its state from {source} (recovery {generation})", file=sys.stderr, flush=True)
        return None

    def changing(self, store, record: WorldRecord, dead: list) -> str | None:
        """Why the run stops where a rank is lost while the world changes (a leave marked on the record, or a joiner
        admitted and not yet listed); None otherwise."""
        from rlhf_dyna.elastic.join_world import ADMITTED, fate, joiner_name  # torch: on a loss only
        names = {p: p if isinstance(p, str) else joiner_name(p - self.watch.world_size) for p in dead
                 if p not in record.members and (isinstance(p, str) or p >= self.watch.world_size)}
        joining = [p for p, name in names.items() if fate(store, name) == ADMITTED]
        lost = [p for p in dead if p in record.members] + joining
        if not lost or not (record.changing or joining):
            return None
        return (f"process {', '.join(map(str, lost))} lost during a membership change of the {len(record.members)}-rank "
                f"world {record.n} (before the new world's members were published): no world holds a consistent "
                "state to recover to; stopped the run. The newest complete checkpoint is intact: resume it with "
                "trainer.resume=auto.")
