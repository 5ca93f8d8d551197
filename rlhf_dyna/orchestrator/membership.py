"""Config -> membership changes: `elastic.events` followed world by world from the run's placement, and the dry run's
row of each change (elastic.events, elastic.membership, elastic.membership_plan do the work; this reads the config)."""
from __future__ import annotations

from ..config import Config
from ..elastic.events import Event, follow, parse_events
from ..elastic.membership import GlobalBatch, NewWorld
from ..elastic.membership_plan import summarize_change
from ..elastic.placement import ACTOR, CRITIC, REFERENCE, REWARD_MODEL
from ..elastic.policies import make_placement
from ..models.value_catalog import value_catalog
from ..vps.cost import Cluster
from ..vps.model import ModelCatalog
from .placements import placement_request
from .reward_dry_run import reward_model_catalog


def global_batch(cfg: Config) -> GlobalBatch:
    prompts = cfg.task.prompts_per_step
    return GlobalBatch(prompts, prompts * cfg.rollout.n, cfg.algorithm.mini_batches)


def membership_worlds(cfg: Config) -> list[tuple[Event, NewWorld]]:
    """Each scripted event with the world after it; raises EventError naming the first entry that cannot run."""
    events = parse_events(list(cfg.elastic.events), cfg.trainer.total_steps)
    request = placement_request(cfg)
    return follow(events, make_placement(request), request.train, cfg.rollout.tp, global_batch(cfg))


def membership_rows(cfg: Config, catalog: ModelCatalog, cluster: Cluster) -> list[dict]:
    """One dry-run row per scripted change, `elastic/<leave|join>/<ranks>@<step>`: every training role's state moved
    into the new world (the critic as the policy's value model, a reward model as its own)."""
    catalogs = {ACTOR: catalog, REFERENCE: catalog, CRITIC: value_catalog(catalog),
                REWARD_MODEL: reward_model_catalog(cfg, catalog)}
    return [summarize_change(event.name, world, catalogs, cluster) for event, world in membership_worlds(cfg)]
