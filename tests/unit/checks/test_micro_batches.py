"""algorithm.micro_batch_tokens is refused before spawn where it cannot run: below 0, or with pipeline stages."""
from __future__ import annotations

import pytest

from rlhf_dyna.config import Config, LayoutSwitchConfig
from rlhf_dyna.checks import ConfigError, check_config


def _config(tokens: int, pp: int = 1, switch_pp: int | None = None) -> Config:
    cfg = Config(dry_run=True)  # the checks before spawn, without devices
    cfg.algorithm.micro_batch_tokens = tokens
    cfg.parallel.train.pp = pp
    if switch_pp is not None:
        cfg.parallel.schedule = [LayoutSwitchConfig(step=3, pp=switch_pp)]
    cfg.model.num_hidden_layers = 4
    return cfg


def test_a_token_budget_without_pipeline_stages_passes() -> None:
    check_config(_config(4096))


@pytest.mark.parametrize("cfg,message", [
    (_config(-1), "algorithm.micro_batch_tokens=-1 is out of range"),
    (_config(4096, pp=2), "with pipeline parallel (pp=2)"),
    (_config(4096, switch_pp=2), "with pipeline parallel (pp=2)"),
])
def test_token_budgets_that_cannot_run_are_refused(cfg: Config, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        check_config(cfg)
    assert "micro_batch_size" in str(err.value)  # what would be right
