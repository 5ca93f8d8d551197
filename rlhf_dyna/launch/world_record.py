"""Which process is which rank of the current world, as the ranks publish it on the job's store (docs/elastic/faults.md,
"Membership changes beside recovery"): the launcher reads it before each decision on a lost rank (launch/lost_ranks.py).

    world = {"n": 2, "members": [0, 2, 4, "request0"], "changing": false}

`members[r]` is rank r's process: its launch index (the launched ranks, then the scripted joiners world_size + k), or
its elastic.join name. `n` counts the worlds since launch; no record yet is world 0 of the launched ranks in order.
Every write is a compare-and-set on the bytes read, so the ranks and the launcher cannot both move the world:
- rank 0 of the old world marks a leave "changing" before its first collective (a rank lost from then on, until the
  new world's list is published, stops the run: nothing holds a consistent state of a world half changed);
- rank 0 of the new world publishes its members once the snapshot ring covers it (orchestrator/recovery.py);
- rank 0 at a join's claim, where the join is the boundary's first change: the old members, then the claimed joiners
  (a joiner lost inside its join is a lost rank of that world: the survivors go back to the snapshot's world);
- the launcher, announcing a loss: the survivors (a recovery's world)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

WORLD_KEY = "world"  # on the job's store (elastic.join_world.job_client_store)


@dataclass
class WorldRecord:
    n: int
    members: list = field(default_factory=list)  # rank r's process: launch index or elastic.join name
    changing: bool = False

    def dumps(self) -> str:
        return json.dumps(asdict(self))


def read_world(store, launched: int) -> tuple[WorldRecord, str]:
    """The current record and its bytes as stored ("" where none is: world 0 of the `launched` ranks)."""
    if not store.check([WORLD_KEY]):
        return WorldRecord(0, list(range(launched))), ""
    raw = store.get(WORLD_KEY).decode()
    return WorldRecord(**json.loads(raw)), raw


def replace_world(store, raw: str, record: WorldRecord) -> bool:
    """`record` in place of the one read as `raw`; False where someone moved the world since."""
    new = record.dumps()
    return store.compare_set(WORLD_KEY, raw, new).decode() == new


def mark_changing(store, launched: int) -> bool:
    """Rank 0 of the old world, before a leave: whether the record is "changing" now (False: the launcher announced a
    loss first, and the change's collectives fail over the lost rank)."""
    record, raw = read_world(store, launched)
    return record.changing or replace_world(store, raw, WorldRecord(record.n, record.members, True))


def unmark_changing(store, launched: int) -> None:
    """Rank 0, where every change of the boundary was refused: the world stays as published."""
    record, raw = read_world(store, launched)
    if record.changing:
        replace_world(store, raw, WorldRecord(record.n, record.members))


def publish_world(store, launched: int, members: list) -> None:
    """Rank 0 of a new world whose snapshot ring is formed: its members, where a change marked the record (a join
    published them at its claim already)."""
    record, raw = read_world(store, launched)
    if record.changing or record.members != members:
        replace_world(store, raw, WorldRecord(record.n + 1, members))


def claim_published(store, launched: int, joiners: list) -> bool:
    """Rank 0 at a join's claim: the old members, then `joiners`, as the next world (where the record is "changing",
    an earlier change of the boundary: the list comes with the new world's ring); False where the launcher announced
    a loss first."""
    record, raw = read_world(store, launched)
    return record.changing or replace_world(store, raw, WorldRecord(record.n + 1, record.members + joiners))
