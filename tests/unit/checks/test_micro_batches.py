"""algorithm.micro_batch_tokens is refused before spawn where it cannot run: below 0, or with pipeline stages."""
from __future__ import annotations

import pytest

from rlhf_dyna.config import Config, LayoutSwitchConfig
from rlhf_dyna.checks import ConfigError, check_config
from rlhf_dyna.checks.micro_batches import resolve_share_prompts


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


def _sharing(share: str, tp: int = 1, switch_tp: int | None = None) -> Config:
    cfg = _config(0)
    cfg.algorithm.share_prompts = share
    cfg.parallel.world_size, cfg.parallel.train.tp = 4, tp
    if switch_tp is not None:
        cfg.parallel.schedule = [LayoutSwitchConfig(step=3, tp=switch_tp)]
    return cfg


@pytest.mark.parametrize("tp,switch_tp", [(2, None), (1, 2)])
def test_shared_prompts_on_outside_data_parallel_training_are_refused(tp: int, switch_tp: int | None) -> None:
    with pytest.raises(ConfigError, match="algorithm.share_prompts=on with a training layout of tp=2") as err:
        check_config(_sharing("on", tp, switch_tp))
    assert "algorithm.share_prompts=off" in str(err.value)  # what would be right
    check_config(_sharing("auto", tp, switch_tp))  # auto turns itself off there


@pytest.mark.parametrize("share,tp,cuda,resolved", [
    ("auto", 1, False, "on"), ("auto", 1, True, "off"), ("auto", 2, False, "off"), ("on", 1, True, "on"),
    ("off", 1, False, "off"),
])
def test_auto_shares_prompts_for_data_parallel_training_on_the_cpu(share: str, tp: int, cuda: bool,
                                                                  resolved: str) -> None:
    assert resolve_share_prompts(_sharing(share, tp), cuda) == resolved
