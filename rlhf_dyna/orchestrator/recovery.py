"""Surviving a lost rank (elastic.replicas=1 or elastic.recover_from_checkpoint, placement=colocate, lend or split;
docs/elastic/recovery.md; under lend the snapshot is of the step's end, every role at home, and the
new world's lend sets come with its placement, Runtime.enter_world; under split each set shrinks to its survivors,
and a rollout rank, which holds no role, takes part in the ring with each role's shell; a frozen reward model gets no
replica: it is loaded again from its files).

Every `elastic.snapshot_every` steps, at the step's end, each rank copies its shard of every training role's state
(fp32 parameters and AdamW moments of the actor and critic, the reference's parameters) into its own slot files on
node-local disk, the next rank takes a replica of it by the ring plan (transition/replica_state.py, elastic/replicas.py),
and the rank keeps the loop's state of that step (prompt sampler, RNGs, task position, KL controller).

When a rank dies, the launcher announces it on the job's store (launch/lost_ranks.py). A watchdog thread on every
rank waits for that announcement and shuts the old world's connections (launch/sockets.py: gloo has no abort), so a
rank blocked in a collective gets out at once. The loop (orchestrator/loop.py) hands the error to `recover`, which:
1. waits for the announcement (an error without one is re-raised: it was not a lost rank);
2. aborts vLLM's unfinished requests, releases vLLM's groups and the old default group (rollout/reform.py) and
   enters a new default group over the survivors (elastic/world_switch.py);
3. plans the new world as a leave of the lost ranks would (elastic.membership.world_after), builds empty engines on
   its mesh and fills them from the snapshot: the survivors' own pieces and the lost ranks' replicas, by the leave's
   plan with the lost ranks' sends served by their replica holders;
4. rolls the loop back to the snapshot's step, re-forms vLLM over the new world, syncs the weights, rewinds the run's
   metrics to that step (where rank 0 was lost, the first survivor opens the run's sinks: Run.rolled_back), and
   refreshes the replicas on the new ring at once.
Where the announcement says "checkpoint" (no surviving replica holds some lost piece, or the run keeps none), step 3-4
load the newest complete checkpoint into empty engines in place instead (orchestrator/checkpoint_recovery.py).
The next step logs elastic/recovery/{seconds,steps_lost,bytes_moved,source,...}.

Membership changes (elastic.events, SIGTERM leaves, elastic.join requests; orchestrator/world_changes.py) run beside
it: before each change the snapshot's send is finished (the change destroys every group), and right after the
boundary's changes every rank of the new world, a joiner included, forms the ring over it and takes a snapshot at
once (after_change), then rank 0 publishes the world's members for the launcher (launch/world_record.py). A joiner lost
inside its join goes back to the snapshot's world (orchestrator/snapshot_world.py), an old rank cannot
(RecoveryImpossible); a rank lost inside a leave stops the run (the launcher sees the world record "changing").
"""
from __future__ import annotations

import os
import threading
import time

import torch
import torch.distributed as dist

from ..config import Config
from ..elastic.join_world import job_client_store
from ..elastic.faults import kill_point
from ..elastic.membership import WorldChange, world_after
from ..elastic.placement import REWARD_MODEL, Placement
from ..elastic.policies import make_placement
from ..elastic.replicas import Served, holder_of, recovers_from_checkpoint
from ..elastic.world_switch import enter_new_world
from ..launch.lost_ranks import recovered_key
from ..launch.scratch import process_scratch
from ..launch.world_record import publish_world
from ..rollout.reform import release_groups
from ..train.mesh import build_mesh
from ..transition.relayout import empty_engine_like, meta_skeleton
from ..transition.replica_state import (RoleSnapshot, held_bytes, memory_metrics, replica_buffers, restore_role,
                                        send_replicas, shell_of, take_snapshot)
from ..transition.snapshot_files import PeerDir, SnapshotFiles
from .checkpoint_recovery import load_in_place, newest_complete
from .leave import trained_layout
from .loss_watchdog import Watchdog
from .membership import global_batch
from .placements import placement_request
from .run import Run
from .snapshot_world import (WORLDS, EngineTemplate, LoopState, SnapshotWorld, joiner_gone, only_joiners_lost,
                             snapshot_world_again)

ROLES = ("actor", "critic", "reference")
ANNOUNCED_WITHIN_S = 30.0  # an error with no lost rank announced by then was not a lost rank's: it is re-raised
SOURCES = {"replicas": 1.0, "checkpoint": 2.0}  # elastic/recovery/source: where the lost state came from


class RecoveryImpossible(RuntimeError):
    """The survivors cannot rebuild the lost state: the message names what was lost."""


class Recovery:
    """Surviving a lost rank, on one rank: the watchdog, the recovery, and with elastic.replicas=1 the snapshots."""

    def __init__(self, cfg: Config, joined: bool = False, process: int | str = 0) -> None:
        """`joined`: a process that entered through a join; its ring forms at the start of its first step. `process`:
        its name in the world record (launch/world_record.py)."""
        request = placement_request(cfg)
        self.cfg, self.every, self.snapshots = cfg, cfg.elastic.snapshot_every, bool(cfg.elastic.replicas)
        self.placement: Placement = make_placement(request)
        self.preferred, self.batch = request.train, global_batch(cfg)
        self.roles: dict[str, RoleSnapshot] = {}
        self.templates: dict[str, EngineTemplate] = {}  # each role's engine as of the last snapshot
        self.loop: LoopState | None = None
        self.staged: tuple[dict[str, RoleSnapshot], LoopState] | None = None  # received, not yet committed
        self.watchdog = Watchdog()
        self.store = job_client_store()  # the main thread's client (the watchdog polls its own)
        self.pending: dict[str, float] = {}  # the recovery's metrics, logged with the next step
        # the snapshot thread's: collectives of its own, beside the loop's
        self.side = dist.new_group(backend="gloo") if self.snapshots and not joined else None
        self.ring_world = dist.get_world_size() if not joined else None  # the world the side group spans
        self.ring_at: int | None = None if joined else 0  # the membership's generation when the ring formed
        self.process, self.sender, self.send_error = process, None, None  # the snapshot thread and its error
        self.sent, self.recorder = {}, None  # the last completed send's metrics; the runtime's trace
        self.files: SnapshotFiles | None = None  # node-local: the own copies' slot files (launch/scratch.py)
        self.peers: tuple[dist.ProcessGroup, list[PeerDir]] | None = None  # the side group's ranks' files
        self.committed_ring = None  # the side group the committed snapshot (self.roles) was sent over
        rank, world = dist.get_rank(), dist.get_world_size()
        fallback = recovers_from_checkpoint(cfg.elastic.replicas, cfg.elastic.recover_from_checkpoint)
        if self.snapshots:
            print(f"rlhf_dyna: elastic.replicas=1: rank {rank} (pid {os.getpid()}) holds the replica of rank "
                  f"{(rank - 1) % world}'s shards, refreshed every {self.every} step(s)", flush=True)
        if fallback:
            print(f"rlhf_dyna: elastic.recover_from_checkpoint: rank {rank} (pid {os.getpid()}) survives a lost rank "
                  f"that no replica covers from the newest complete checkpoint", flush=True)

    def start(self, run: Run, runtime) -> None:
        """A launched rank with elastic.replicas=1: the state to survive a loss with, from the start (a joiner's
        first comes with its first step)."""
        membership = getattr(runtime, "membership", None)
        self.files = SnapshotFiles(process_scratch(run.dist_info.run_ident, self.process))
        if membership is not None:  # a change destroys every group: the snapshot's send is finished first
            membership.before_change = self.finish_sending
        if self.snapshots and self.ring_world is not None:
            self.snapshot(run, runtime, run.start_step)

    def snapshot(self, run: Run, runtime, step: int, background: bool = True) -> dict[str, float]:
        """Every role's state and the loop's after `step` copied (here: the live state changes in the next step), each
        shard's replica made on the next rank by a thread over a group of its own during the next step's generation
        (or here, `background=False`); committed once every rank has its replica. The metrics: this copy's and the
        wait for the previous send (elastic/snapshot/{copy,wait}_seconds), the previous send's and memory_metrics."""
        waited = self.finish_sending()
        start, cpu = time.perf_counter(), time.thread_time()
        engines = {role: getattr(runtime, role) for role in ROLES if getattr(runtime, role) is not None}
        slots = {role: 1 - (snap.slot or 0) for role, snap in self.roles.items()}  # not the committed one's
        keep = self.roles if self.committed_ring is self.side else {}  # a frozen role's, where the ring is the same
        roles = {role: take_snapshot(engine, self.files, role, slots.get(role, 0), keep.get(role))
                 for role, engine in engines.items()}
        if self.cfg.placement.policy == "split":  # a rollout rank holds no role, but may hold (and serve) a replica
            shells = runtime.from_actor({role: shell_of(snap) for role, snap in roles.items()})
            roles = roles or shells
        replica_buffers(roles, dist.get_rank())
        self.templates = {role: EngineTemplate.of(e, self.templates.get(role)) for role, e in engines.items()}
        membership = getattr(runtime, "membership", None)
        loop = LoopState.of(run, step, SnapshotWorld(getattr(membership, "placement", self.placement), runtime.layout),
                            getattr(membership, "generation", 0) + self.watchdog.generation)
        self.recorder = runtime.recorder
        copied, cpu = time.perf_counter() - start, time.thread_time() - cpu
        self.sender = threading.Thread(target=self._send, args=(roles, loop, copied, cpu), daemon=True,
                                       name="rlhf_dyna-snapshot")
        self.sender.start()
        if not background:
            waited += self.finish_sending()
        return {**self.sent, "elastic/snapshot/copy_seconds": copied, "elastic/snapshot/wait_seconds": waited}

    def _send(self, roles: dict[str, RoleSnapshot], loop: LoopState, copied: float, cpu: float) -> None:
        """The snapshot thread: the replicas over the side group, then the commit. `copied`, `cpu`: the main
        thread's seconds and CPU seconds for the copy."""
        try:
            began, cpu_began = time.perf_counter(), time.thread_time()
            if self.peers is None or self.peers[0] is not self.side:  # a new ring: where its ranks' files are
                peers: list[PeerDir | None] = [None] * dist.get_world_size(self.side)
                dist.all_gather_object(peers, PeerDir.of(self.files.directory), group=self.side)
                self.peers = (self.side, peers)
                self.files.forget_peers()
            moved = send_replicas(roles, self.side, self.peers[1], self.files, loop.key, self.recorder,
                                  self.roles if self.committed_ring is self.side else None)
            # complete here (this rank's receives are done); committed once every rank is: a lost rank may interrupt
            # the barrier after some passed it, and then every rank had received everything (recover promotes it)
            self.staged = (roles, loop)
            dist.barrier(group=self.side)
            peak = held_bytes(roles, self.roles)  # the previous snapshot: held until this commit
            (self.roles, self.loop), self.staged, self.committed_ring = self.staged, None, self.side
            rank = dist.get_rank(self.side)
            self.files.keep_only({role: {d: t.numel() for d, t in snap.own.items()} for role, snap in roles.items()},
                                 {role: snap.ring_index(rank).sizes for role, snap in roles.items()})
            self.sent = {"elastic/snapshot/seconds": copied + time.perf_counter() - began,
                         "elastic/snapshot/bytes": float(moved), **memory_metrics(roles, peak, self.files.disk_bytes()),
                         "elastic/snapshot/cpu_seconds": cpu + time.thread_time() - cpu_began}
        except Exception as err:  # noqa: BLE001 - handed to the main thread by finish_sending
            self.send_error = err

    def finish_sending(self, timeout: float | None = None) -> float:
        """Wait for the snapshot thread; its error (a lost rank's, then the loop recovers) is raised here."""
        start = time.perf_counter()
        if self.sender is not None:
            self.sender.join(timeout)
            if self.sender.is_alive():
                raise RecoveryImpossible(f"the snapshot thread did not end within {timeout} s")
            self.sender = None
        err, self.send_error = self.send_error, None
        if err is not None:
            raise err
        return time.perf_counter() - start

    def after_step(self, run: Run, runtime, step: int) -> dict[str, float]:
        """The metrics to log with `step`: a due snapshot's, the last recovery's, the world's size."""
        metrics, self.pending = {**self.pending, "elastic/world_size": float(dist.get_world_size())}, {}
        if self.snapshots and step % self.every == 0:
            metrics.update(self.snapshot(run, runtime, step))
            metrics["elastic/snapshot/ring_world"] = float(self.ring_world)
        return metrics

    def after_change(self, run: Run, runtime, step: int) -> dict[str, float]:
        """Collective over the world, right after the changes of the boundary after `step` (a joiner: its first call):
        where the world changed, the ring over the new world and its snapshot now (sent before the step: a rank lost
        in it is recovered from this world's ring), then rank 0 publishes the world's members for the launcher."""
        membership = getattr(runtime, "membership", None)
        generation = getattr(membership, "generation", 0)
        if self.ring_at == generation:
            return {}
        self.ring_at, metrics = generation, {}
        if self.snapshots:
            self.side, self.ring_world = dist.new_group(backend="gloo"), dist.get_world_size()
            metrics = self.snapshot(run, runtime, step, background=False)
            metrics["elastic/snapshot/ring_world"] = float(self.ring_world)
        members = [None] * dist.get_world_size()
        dist.all_gather_object(members, self.process)
        if dist.get_rank() == 0:
            publish_world(self.store, self.cfg.parallel.world_size, members)
        return metrics

    def recover(self, run: Run, runtime, err: BaseException, step: int) -> int:
        """After `err` interrupted `step`: rebuild the world without the announced lost ranks (collective over the
        survivors) and return the step to run next; re-raises `err` where no rank was lost."""
        caught = time.time()
        news = self.watchdog.wait(ANNOUNCED_WITHIN_S)
        if news is None:
            raise err
        lost, old_world, died_at = tuple(news["lost"]), news["world_size"], news["died_at"]
        source = news.get("source", "replicas")
        old_rank = dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"])
        started = time.perf_counter()
        try:  # the snapshot thread: its connections are shut too, so it ends at once
            self.finish_sending(timeout=ANNOUNCED_WITHIN_S)
        except RecoveryImpossible:
            raise
        except Exception:  # noqa: BLE001 - the lost rank's error: the snapshot it sent is not committed
            pass
        if runtime.rollout is not None:  # split's training ranks have none
            runtime.rollout.drop_requests()
        backend = dist.get_backend() if dist.is_initialized() else "gloo"
        release_groups()  # vLLM's groups and the old default group; the engines stay
        survivors = [r for r in range(old_world) if r not in lost]
        new_rank, size = survivors.index(old_rank), len(survivors)
        # a client of its own: the watchdog's is polled from its thread; a prefix no leave or join uses
        enter_new_world(job_client_store(), 1000 + self.watchdog.generation, new_rank, size, backend)
        kill_point("elastic/recovery", run.dist_info.rank, run.dist_info.run_ident)  # tests: a failure in recovery
        self.watchdog.rearm()
        if self.snapshots:
            self.side = dist.new_group(backend="gloo")
        membership = getattr(runtime, "membership", None)
        served = Served(lost, old_world) if source == "replicas" else None  # a checkpoint's: no replica serves
        if source == "replicas":
            self.newest_snapshot(lost, old_world, step, err)
        if source == "replicas" and self.loop.world != old_world:  # only joiners lost: the snapshot's world again
            new = snapshot_world_again(WorldChange(old_world, lost), self.loop.where, self.roles, self.cfg.rollout.tp)
            served = Served((), self.loop.world)
        else:  # the placement of the joins, where the run admits them
            new = world_after(getattr(membership, "placement", self.placement), self.preferred, self.cfg.rollout.tp,
                              self.batch, WorldChange(old_world, lost))
        layout = trained_layout(new)  # over the new world, or split's training set in it

        def reform_rollout() -> None:  # colocate's engines one replica fewer per lost rank; split's stay outside
            runtime.reform_rollout(WorldChange(old_world, lost), runtime.rollout_layout.tp, new.rollout_tp)

        entered = time.perf_counter()
        if source == "checkpoint":
            back_to, moved, whence = self.from_checkpoint(run, runtime, new, layout, reform_rollout, lost, step, err)
            restored = rolled = time.perf_counter()  # the load is the move; the rollout is re-formed inside it
        else:
            back_to, moved, whence, restored = self.from_replicas(run, runtime, new, layout, reform_rollout,
                                                                  served)
            rolled = time.perf_counter()
        self.placement, self.ring_world = new.placement, size
        took_over = run.rolled_back(back_to)  # metrics.jsonl from the next step; rank 0 lost: its successor's sinks
        if membership is not None:
            membership.lost_ranks(new.placement)
        if self.snapshots:
            self.snapshot(run, runtime, back_to, background=False)  # the replicas of the new ring, at once
        done_at = time.perf_counter()
        trace_phases(runtime.recorder, step, died_at, caught, started, (entered, restored, rolled, done_at))
        if new_rank == 0:
            self.store.set(recovered_key(self.watchdog.generation), "1")
            print(f"rlhf_dyna: rank {', '.join(map(str, lost))} of {old_world} lost during step {step} "
                  f"({err_line(err)}); {whence}, rolled back to step {back_to}; training layout "
                  f"{layout.describe()} on {size} ranks, {done_at - started:.2f} s"
                  + (f"; rank {old_rank} is rank 0 now and writes the run's metrics" if took_over else ""), flush=True)
        self.pending = {"elastic/recovery/seconds": done_at - started,
                        "elastic/recovery/steps_lost": float(step - back_to),
                        "elastic/recovery/bytes_moved": float(moved), "elastic/recovery/source": SOURCES[source],
                        "elastic/recovery/detect_seconds": caught - died_at,
                        "elastic/recovery/world_seconds": entered - started,
                        "elastic/recovery/move_seconds": restored - entered,
                        "elastic/recovery/rollout_seconds": rolled - restored}
        if self.snapshots:
            self.pending["elastic/recovery/snapshot_seconds"] = self.sent["elastic/snapshot/seconds"]
        return back_to + 1

    def from_checkpoint(self, run: Run, runtime, new, layout, reform_rollout, lost: tuple[int, ...], step: int,
                        err: BaseException) -> tuple[int, int, str]:
        """The newest complete checkpoint loaded in place on the new world: (its step, 0 bytes moved, what was done)."""
        self.roles, self.loop, self.staged = {}, None, None  # the old ring's snapshots: not of the state loaded
        path = newest_complete(run.out_dir)
        if path is None:
            raise RecoveryImpossible(f"rank {list(lost)} lost during step {step} with pieces no replica holds, "
                                     f"and no complete checkpoint under {run.out_dir} to load") from err
        back_to = load_in_place(run, runtime, layout, new.placement, path, reform_rollout)
        why = "no surviving replica holds all of it" if self.snapshots else "no replicas kept"
        return back_to, 0, f"{why}: loaded {path} in place"

    def newest_snapshot(self, lost: tuple[int, ...], old_world: int, step: int, err: BaseException) -> None:
        """Collective over the survivors: agreed on the snapshot to restore, or RecoveryImpossible where none serves."""
        self.agree_on_snapshot()
        if self.loop is None or not self.roles:
            raise RecoveryImpossible(f"rank {list(lost)} lost during step {step}, before the first snapshot: no "
                                     f"replica holds its state yet") from err
        if self.loop.world != old_world and not only_joiners_lost(lost, old_world, self.loop.world):
            raise RecoveryImpossible(f"rank {list(lost)} of {old_world} lost during step {step}, the first step "
                                     f"after a join: the newest snapshot is of the {self.loop.world}-rank world "
                                     f"before it, which the lost ranks were part of") from err

    def from_replicas(self, run: Run, runtime, new, layout, reform_rollout, served: Served) -> tuple[int, int, str, float]:
        """Every role rebuilt from the survivors' snapshot copies and the lost ranks' replicas (`served`), the rollout
        re-formed and synced, the loop rolled back: (the snapshot's step, bytes moved, what was done, when moved)."""
        engines, moved = self.restore_replicas(runtime, new, layout, served)
        restored = time.perf_counter()
        reform_rollout()
        runtime.enter_world(layout, engines, new.placement)
        runtime.sync_weights()
        self.loop.restore(run)
        held = [r for r in served.lost if r in self.loop.where.layout.ranks]  # split: a rollout rank holds none
        whence = (f"rebuilt its state from the replicas on rank {', '.join(str(holder_of(r, served.world_size)) for r in held)} and the survivors' own shards "
                  f"({moved / 2**20:,.2f} MiB moved)" if held else "it held no training state (split's rollout set: "
                  "one engine fewer)" if served.lost else joiner_gone(served.world_size))
        if runtime.scorer is not None:
            whence += f", the reward model loaded again from {self.cfg.reward_model.path}"
        return self.loop.step, moved, whence, restored

    def restore_replicas(self, runtime, new, layout, served: Served) -> tuple[dict, int]:
        """Collective over the new world: each role's state rebuilt into empty engines on `layout` from the
        survivors' own snapshot copies and the lost ranks' replicas; the engines and the bytes moved between ranks."""
        mesh, engines, moved = build_mesh(layout), {}, 0
        holds = dist.get_rank() in layout.ranks  # not on split's rollout ranks
        for move in new.moves:
            if move.role == REWARD_MODEL:  # frozen: loaded again from its files (reward_model_again), no replica
                continue
            old = getattr(runtime, move.role)  # None inside a join (the move had taken it) and off split's training set
            if holds:
                engines[move.role] = (empty_engine_like(old, layout, mesh, meta_skeleton(old.model)) if old is not None
                                      else self.templates[move.role].empty(layout, mesh))
            done = restore_role(self.roles[move.role], engines.get(move.role), move.dst, served,
                                recorder=runtime.recorder)
            moved += done.bytes_moved
            setattr(runtime, move.role, None)  # the old world's engine: its state is rebuilt
        reward_model_again(runtime, new.placement)
        return engines, moved

    def agree_on_snapshot(self) -> None:
        """Collective over the survivors: the newest snapshot any of them committed (a rank that committed it passed
        the barrier every rank entered with its replica received, so every survivor has it staged)."""
        mine = torch.tensor([self.loop.key if self.loop is not None else -1], dtype=torch.int64)
        newest = mine.clone()
        dist.all_reduce(newest, op=dist.ReduceOp.MAX)
        if int(newest) > int(mine):
            if self.staged is None or self.staged[1].key != int(newest):
                raise RecoveryImpossible(f"survivors disagree on the snapshot: step {int(newest) // WORLDS} committed "
                                         f"elsewhere, this rank holds step {int(mine) // WORLDS}")
            self.roles, self.loop = self.staged
        self.staged = None

    def close(self, failed: bool) -> None:
        """The end of the run: the last snapshot's send finished (every rank's thread takes part), the watchdog off,
        the snapshot's files removed (the launcher removes a killed rank's)."""
        self.watchdog.close()
        if not failed:
            self.finish_sending()
        if self.files is not None:
            self.files.remove()


def reward_model_again(runtime, placement: Placement) -> None:
    """Collective over the new world: the frozen reward model (where task.reward names rm) loaded from its files on
    `placement`'s set, as the run built it at the start: its shards need no snapshot and no replica."""
    if runtime.scorer is not None:
        runtime.scorer.rebuild(placement)


def trace_phases(recorder, step: int, died_at: float, caught: float, started: float, marks: tuple) -> None:
    """The recovery's phases on the run's trace (Perfetto, timeline.png): elastic/recovery/<phase>, wall-clock."""
    if recorder is None:
        return
    offset = time.time() - time.perf_counter()  # perf_counter marks -> wall clock
    recorder.add("elastic/recovery/detect", 0, died_at, max(0.0, caught - died_at), {"step": step})
    begin = started
    for name, end in zip(("world", "move", "rollout", "snapshot"), marks):
        recorder.add(f"elastic/recovery/{name}", 0, begin + offset, end - begin, {"step": step})
        begin = end


def err_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1][:160]}" if text else type(err).__name__
