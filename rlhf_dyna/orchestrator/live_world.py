"""The run's world as it changes (placement=colocate, split or lend; docs/elastic/membership.md): its placement, the preferred layout and
rollout tp, the scripted changes, the job's store, and which worlds this process has been part of. Held by the
runtime; the leave (orchestrator/leave.py) and the join (orchestrator/join.py) read and advance it."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch.distributed as dist

from ..config import Config
from ..elastic.events import Event, parse_events
from ..elastic.membership import GlobalBatch
from ..elastic.placement import Placement
from ..elastic.policies import make_placement
from ..elastic.sigterm import LeaveOnSigterm
from ..elastic.replicas import recovers_from_checkpoint
from ..elastic.world_prebuild import WorldBuild
from ..launch.world_record import mark_changing, unmark_changing
from ..parallel_layout import ParallelLayout
from .membership import global_batch
from .placements import placement_request


@dataclass
class Membership:
    placement: Placement
    preferred: ParallelLayout  # the configured training layout, dp unresolved: each world prefers it
    rollout_tp: int
    batch: GlobalBatch
    store: dist.Store  # a client of the job's store (elastic.join_world): every new world's rendezvous is on it
    events: list[Event] = field(default_factory=list)  # elastic.events, in step order
    sigterm: LeaveOnSigterm | None = None  # elastic.leave_on_sigterm: SIGTERM asks this rank to leave
    generation: int = 0  # worlds entered since launch: names the store prefix of the next one
    joiners_before: int = 0  # joiner processes of the events already done (the next join's first joiner index)
    entered_before: int | None = None  # a joiner: the step whose boundary it finished inside its entry
    accepts_requests: bool = False  # elastic.accept_joins as resolved before spawn: look for elastic.join requests
    requests_seen: int = 0  # elastic.join requests admitted or refused so far (rank 0 reads them, every rank counts)
    agreed: list[str] = field(default_factory=list)  # elastic.join requests agreed on at the step's start
    build: WorldBuild | None = None  # the next boundary's first world, building in the background
    build_for: str | None = None  # the change it was planned for: an event's text, or "requests"
    launched: int = 0  # parallel.world_size: the launched ranks (the world record's world 0)
    records: bool = False  # a lost rank is survived: the world's members are published (launch/world_record.py)
    before_change: Callable[[], None] | None = None  # the snapshot's send finished (orchestrator/recovery.py)
    marked: bool = False  # rank 0: this boundary marked the world record "changing"
    process: int | str | None = None  # this process in the world record: an elastic.join name (else its launch index)

    @classmethod
    def of(cls, cfg: Config, store: dist.Store, sigterm: bool = True) -> Membership | None:
        """The run's membership, or None where nothing can change it (no elastic.events, no leave_on_sigterm, no
        elastic.accept_joins). `store`: this process's client of the job's store (elastic.join_world)."""
        e = cfg.elastic
        if not e.events and not e.leave_on_sigterm and not e.accept_joins:
            return None
        request = placement_request(cfg)
        return cls(make_placement(request), request.train, cfg.rollout.tp, global_batch(cfg), store,
                   parse_events(list(e.events), cfg.trainer.total_steps),
                   LeaveOnSigterm().install() if e.leave_on_sigterm and sigterm else None,
                   accepts_requests=bool(e.accept_joins), launched=cfg.parallel.world_size,
                   records=bool(e.replicas) or recovers_from_checkpoint(e.replicas, e.recover_from_checkpoint))

    def begin_change(self, leave: bool) -> None:
        """Collective over the world, before a change's first step: the snapshot's send finished (the change destroys
        its group); before a leave, where a lost rank is survived, rank 0 marks the world record "changing" and every
        rank waits for it (a rank lost from then on stops the run; one lost before is a loss of this world)."""
        if self.before_change is not None:
            self.before_change()
        if leave and self.records:
            if dist.get_rank() == 0:
                self.marked = mark_changing(self.store, self.launched) or self.marked
            dist.barrier()

    def end_changes(self, generation: int) -> None:
        """After the boundary's changes (the world was `generation` before them): where none happened, rank 0 takes
        its mark back; a new world publishes its members once its snapshot ring is formed (orchestrator/recovery.py)."""
        if self.marked and self.generation == generation and dist.get_rank() == 0:
            unmark_changing(self.store, self.launched)
        self.marked = False

    def take_build(self, change: str) -> WorldBuild | None:
        """The background build planned for `change` (it is happening now), or None."""
        if self.build_for != change:
            return None
        build, self.build, self.build_for = self.build, None, None
        return build

    def drop_build(self) -> None:
        """A build no change of the boundary took (a change refused at the boundary): its groups go."""
        if self.build is not None:
            self.build.close()
        self.build, self.build_for = None, None

    def lost_ranks(self, placement: Placement) -> None:
        """Survivors of a lost rank entered a new world with `placement`: joins agreed on in the lost world are agreed
        on again in this one (their requests read anew), and a build for the lost world goes."""
        self.placement = placement
        self.drop_build()
        self.requests_seen -= len(self.agreed)
        self.agreed = []

    def due_before(self, step: int) -> list[Event]:
        """The scripted changes after step - 1 (before `step`), in the order given."""
        return [e for e in self.events if e.step == step - 1]
