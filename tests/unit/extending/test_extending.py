"""docs/extending.md, followed step by step for an advantage estimator: one function and its registration, which the
checks then know (the toy architecture and placement policy run on ranks: tests/ranks/extending/test_extending.py)."""
from __future__ import annotations

import pytest
import torch

from rlhf_dyna.algos.estimators import ESTIMATORS, SEQUENCE, register_estimator
from rlhf_dyna.algos.grpo import group_advantages
from rlhf_dyna.checks import ConfigError, check_config
from rlhf_dyna.config import Config


# --- an advantage estimator: one function and its registration ------------------------------------------------------
def sign_advantages(rewards: torch.Tensor, n: int, alg) -> torch.Tensor:
    """+1 above the prompt's mean reward, -1 below, 0 at it."""
    return torch.sign(group_advantages(rewards, n, norm_by_std=False))


def register_sign() -> None:
    register_estimator("sign", SEQUENCE, group_baseline=True)(sign_advantages)


def test_a_toy_estimator_is_one_function_and_its_registration():
    register_sign()
    cfg = Config()
    cfg.algorithm.adv_estimator, cfg.dry_run = "sign", True
    check_config(cfg)  # the checks know it from its registration
    cfg.rollout.n = 1
    with pytest.raises(ConfigError, match="adv_estimator=sign with rollout.n=1"):
        check_config(cfg)  # group_baseline=True: it needs other samples of the prompt
    est = ESTIMATORS["sign"]
    assert est.fn(torch.tensor([1.0, 0.0, 3.0, 3.0]), 2, cfg.algorithm).tolist() == [1.0, -1.0, 0.0, 0.0]
