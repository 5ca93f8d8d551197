"""The run's world as it changes (placement=colocate or split; docs/elastic.md): its placement, the preferred layout and
rollout tp, the scripted changes, the job's store, and which worlds this process has been part of. Held by the
runtime; the leave (orchestrator/leave.py) and the join (orchestrator/join.py) read and advance it."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from ..config import Config
from ..elastic.events import Event, parse_events
from ..elastic.membership import GlobalBatch
from ..elastic.placement import Placement
from ..elastic.policies import make_placement
from ..elastic.sigterm import LeaveOnSigterm
from ..elastic.world_prebuild import WorldBuild
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
                   accepts_requests=bool(e.accept_joins))

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
