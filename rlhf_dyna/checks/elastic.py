"""Checks of the elastic group: every scripted membership change can happen (the event is well formed, its step lies
inside the run, its ranks exist, it empties no role, the new world fits a layout and the same global batch), and what
does not run live yet is refused."""
from __future__ import annotations

from ..config import Config
from ..elastic.events import EventError
from ..orchestrator.membership import membership_worlds
from .errors import ConfigError


def check_elastic(cfg: Config) -> None:
    e = cfg.elastic
    if e.join is not None:
        raise ConfigError(
            f"elastic.join={e.join}: joining a running job is not built yet (docs/elastic.md says what is); start the "
            "job with the world it needs, or plan changes of world with dry_run=true elastic.events=[...].")
    if not e.events:
        return
    try:
        membership_worlds(cfg)
    except EventError as err:
        raise ConfigError(str(err)) from err
    if not cfg.dry_run:
        raise ConfigError(
            f"elastic.events={list(e.events)}: membership changes are planned and predicted by the dry run, but a live "
            "run does not execute them yet (docs/elastic.md); add dry_run=true to see what each change moves and "
            "costs, or drop elastic.events.")
