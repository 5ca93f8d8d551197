"""The launcher's decision on lost ranks (launch/lost_ranks.py), with a dict for the job's store: which losses the
survivors recover from (rank 0's as any other's), the announcement they read, the ranks renumbered after it, the clean
stops that name the lost ranks and pieces, and the fallback to a complete checkpoint on disk (the app test,
tests/app/elastic/test_replica_recovery.py, kills real ranks)."""
from __future__ import annotations

import json
from pathlib import Path

from rlhf_dyna.elastic.join_world import ADMITTED, fate_key
from rlhf_dyna.launch.lost_ranks import LossHandler, LossWatch, lost_key, recovered_key
from rlhf_dyna.launch.world_record import (WorldRecord, claim_published, mark_changing, publish_world, read_world,
                                           replace_world, unmark_changing)
from rlhf_dyna.orchestrator.checkpoint_dirs import MARKER


class DictStore:
    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key].encode()

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        if self.data.get(key, "") == expected:
            self.data[key] = desired
        return self.data.get(key, "").encode()

    def add(self, key: str, amount: int) -> int:
        self.data[key] = str(int(self.data.get(key, "0")) + amount)
        return int(self.data[key])


def test_one_lost_rank_is_announced_and_the_survivors_renumbered():
    watch, store = LossWatch(4), DictStore()
    verdict, why = watch.decide([2], watch.recovered(store))
    assert why is None and verdict == {"lost": [2], "world_size": 4, "processes": [2], "source": "replicas"}
    assert watch.announce(store, verdict, died_at=12.5) == 1
    assert json.loads(store.data[lost_key(1)]) == {**verdict, "died_at": 12.5}
    assert watch.members == [0, 1, 3]
    # a second loss before the survivors said they recovered: a failure during recovery stops the run
    _, why = watch.decide([3], watch.recovered(store))
    assert "rank 2 (process 3) of 3 lost while the survivors were still recovering" in why
    store.set(recovered_key(1), "1")
    verdict, why = watch.decide([3], watch.recovered(store))  # process 3 is rank 2 of the new world
    assert why is None and verdict["lost"] == [2] and verdict["world_size"] == 3


def test_ranks_lost_with_their_replica_holders_stop_the_run_naming_them():
    watch = LossWatch(4)
    _, why = watch.decide([1, 2], True)
    assert "rank 1 (process 1), rank 2 (process 2) of 4 lost at once: rank 1's shard of every training role's " \
           "state (its replica was on rank 2, lost too)" in why
    _, why = watch.decide([3, 0], True)  # the ring closes: rank 3's replica is on rank 0
    assert "rank 0 (process 0), rank 3 (process 3) of 4 lost at once: rank 3's shard of every training role's " \
           "state (its replica was on rank 0, lost too)" in why
    verdict, why = watch.decide([1, 3], True)  # not adjacent: ranks 2 and 0 hold their replicas
    assert why is None and verdict["lost"] == [1, 3]


def test_rank_0_lost_is_announced_and_its_successor_is_rank_0_of_the_next_world():
    """The launcher serves the job's store, so rank 0's loss is recovered as any other: rank 1 holds its replica."""
    handler, store = LossHandler(4, port=0), DictStore()
    handler.store, watch = store, handler.watch
    assert handler.on_deaths([0], died_at=3.0) is None
    assert json.loads(store.data[lost_key(1)]) == {"lost": [0], "world_size": 4, "processes": [0],
                                                   "source": "replicas", "died_at": 3.0}
    assert watch.members == [1, 2, 3] and handler.lost_processes == {0}
    store.set(recovered_key(1), "1")
    verdict, why = watch.decide([1], True)  # process 1 is rank 0 of the new world, and its loss is recovered too
    assert why is None and verdict["lost"] == [0] and verdict["world_size"] == 3 and verdict["processes"] == [1]


def checkpoint(checkpoints: Path, name: str, complete: bool) -> None:
    (checkpoints / name).mkdir(parents=True)
    if complete:
        (checkpoints / name / MARKER).write_text(json.dumps({"files": []}))


def test_pieces_without_a_replica_are_loaded_from_a_complete_checkpoint_or_the_run_stops(tmp_path: Path):
    checkpoints = tmp_path / "checkpoints"
    with_replicas, without = LossWatch(4, True, checkpoints), LossWatch(4, False, checkpoints)
    _, why = with_replicas.decide([1, 2], True)
    assert f"its replica was on rank 2, lost too). Nothing in host memory holds those pieces, and no complete " \
           f"checkpoint is under {checkpoints} to load in place" in why
    _, why = without.decide([2], True)
    assert "rank 2 (process 2) of 4 lost: rank 2's shard of every training role's state (elastic.replicas=0: no " \
           "replica)" in why
    checkpoint(checkpoints, "step_4.tmp", complete=False)  # a save the loss interrupted is not one to load
    assert with_replicas.decide([1, 2], True)[0] is None
    checkpoint(checkpoints, "step_2", complete=True)
    verdict, why = with_replicas.decide([1, 2], True)
    assert why is None and verdict["source"] == "checkpoint" and verdict["lost"] == [1, 2]
    assert with_replicas.decide([2], True)[0]["source"] == "replicas"  # a replica survives: no rollback that far
    assert without.decide([2], True)[0]["source"] == "checkpoint"
    _, why = LossWatch(4, False, None).decide([2], True)
    assert "loading a checkpoint in place is off (elastic.recover_from_checkpoint=false)" in why


def test_the_ranks_published_world_numbers_the_lost_ranks():
    """4 launched ranks; rank 3 left (leave:3@2: marked, then the 3-rank world published), a scripted joiner (process 4)
    and request0 claimed at a join: the loss of process 4 is rank 3 of 5, and the leaver's exit is no member's."""
    handler, store = LossHandler(4, port=0), DictStore()
    handler.store, watch = store, handler.watch
    assert mark_changing(store, 4) and read_world(store, 4)[0].changing
    publish_world(store, 4, [0, 1, 2])
    assert read_world(store, 4)[0].n == 1 and not read_world(store, 4)[0].changing
    assert claim_published(store, 4, [4, "request0"])  # the join is the boundary's first change: listed at its claim
    publish_world(store, 4, [0, 1, 2, 4, "request0"])  # the ring over it formed: the same members, no new world
    assert read_world(store, 4)[0].n == 2
    assert handler.on_deaths([3], died_at=1.0) is None and lost_key(1) not in store.data  # left: no member
    assert handler.on_deaths([4], died_at=2.0) is None
    assert json.loads(store.data[lost_key(1)])["lost"] == [3] and json.loads(store.data[lost_key(1)])["world_size"] == 5
    record = read_world(store, 4)[0]  # the launcher's write: the survivors are world 3
    assert record.n == 3 and record.members == [0, 1, 2, "request0"] and watch.members == record.members


def test_a_rank_lost_while_the_world_changes_stops_the_run():
    handler, store = LossHandler(4, port=0), DictStore()
    handler.store = store
    mark_changing(store, 4)  # a leave began: from now on until the new world is published
    why = handler.on_deaths([1], died_at=1.0)
    assert "process 1 lost during a membership change of the 4-rank world 0 (before the new world's members were " \
           "published)" in why and lost_key(1) not in store.data
    unmark_changing(store, 4)  # the leave was refused at the boundary: the same world again
    store.set(fate_key("joiner0"), ADMITTED)  # claimed, not listed yet (a leave came first at this boundary)
    assert "process 4 lost during a membership change" in handler.on_deaths([4], died_at=2.0)
    assert handler.on_deaths([2], died_at=3.0) is None and json.loads(store.data[lost_key(1)])["lost"] == [2]
    assert read_world(store, 4)[0].members == [0, 1, 3]
    # rank 0 read the world before the launcher moved it: its mark (compare-and-set on what it read) fails
    _, stale = read_world(store, 4)
    store.set(recovered_key(1), "1")
    assert handler.on_deaths([3], died_at=4.0) is None
    assert not replace_world(store, stale, WorldRecord(5, [0, 1], changing=True))
    assert read_world(store, 4)[0].members == [0, 1]
