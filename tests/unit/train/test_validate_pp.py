"""Pipeline settings that cannot run are refused before spawn, each with what is wrong and what would be right."""
from __future__ import annotations

import pytest

from rlhf_dyna.config import Config, LayoutSwitchConfig
from rlhf_dyna.checks import ConfigError
from rlhf_dyna.checks.layouts import check_layouts, check_runs_live
from rlhf_dyna.checks.pipeline import pipeline_problems


def pp_config(**changes) -> Config:
    """grpo_tiny_pp's numbers: 3 layers, 4 ranks as pp2 x dp2, 32 prompts x 8 samples, 16-row micro-batches."""
    cfg = Config()
    cfg.model.num_hidden_layers, cfg.parallel.world_size, cfg.parallel.train.pp = 3, 4, 2
    cfg.task.prompts_per_step, cfg.rollout.n, cfg.algorithm.micro_batch_size = 32, 8, 16
    for dotted, value in changes.items():
        *path, leaf = dotted.split("__")
        obj = cfg
        for part in path:
            obj = getattr(obj, part)
        setattr(obj, leaf, value)
    return cfg


def test_the_recipe_settings_pass():
    assert pipeline_problems(pp_config()) == []
    assert pipeline_problems(pp_config(parallel__train__tp=2)) == []  # pp2 x tp2: DTensor TP inside the stages
    check_runs_live(pp_config())  # the pp refusal is lifted
    assert pipeline_problems(pp_config(trainer__save_every=2, trainer__resume="auto")) == []  # DCP checkpoints of pp


@pytest.mark.parametrize("changes,message", [
    (dict(parallel__train__pp=4, model__num_hidden_layers=3), "pp=4 exceeds model.num_hidden_layers=3"),
    (dict(algorithm__micro_batch_size=48), "do not split into equal micro-batches of algorithm.micro_batch_size=48"),
    (dict(algorithm__micro_batch_size=128), "1F1B needs at least pp=2"),
    (dict(trainer__sft_warmup_steps=5, trainer__sft_batch_size=16), "trainer.sft_batch_size gives 1 micro-batch"),
    (dict(parallel__train__pp_schedule="interleaved"), "pp_schedule='interleaved'; valid: 1F1B, GPipe"),
])
def test_bad_pipeline_settings_are_refused(changes, message):
    cfg = pp_config(**changes)
    assert any(message in p for p in pipeline_problems(cfg)), pipeline_problems(cfg)
    with pytest.raises(ConfigError, match="Pipeline-parallel settings cannot run"):
        check_runs_live(cfg)


def test_gpipe_takes_fewer_micro_batches_than_stages():
    assert pipeline_problems(pp_config(algorithm__micro_batch_size=128, parallel__train__pp_schedule="GPipe")) == []


def test_schedule_switches_into_pipeline_layouts():
    cfg = pp_config(parallel__train__pp=1)
    cfg.parallel.schedule = [LayoutSwitchConfig(step=2, pp=2), LayoutSwitchConfig(step=3, pp=1)]
    check_layouts(cfg)
    assert pipeline_problems(cfg) == []
    cfg.parallel.schedule = [LayoutSwitchConfig(step=2, pp=3)]
    with pytest.raises(ConfigError, match=r"tp\*pp\*cp = 1\*3\*1 = 3 does not divide parallel.world_size=4"):
        check_layouts(cfg)
    cfg.parallel.schedule = [LayoutSwitchConfig(step=2, pp=2)]
    cfg.algorithm.micro_batch_size = 128
    assert any("parallel.schedule[0]: " in p and "1F1B needs" in p for p in pipeline_problems(cfg))
