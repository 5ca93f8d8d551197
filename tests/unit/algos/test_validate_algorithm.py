"""Bad algorithm.* values are refused before spawn with one paragraph that says what would be right."""

import pytest

from rlhf_dyna.config import AlgorithmConfig, Config, RolloutConfig
from rlhf_dyna.checks import ConfigError
from rlhf_dyna.checks.algorithm import check_algorithm
from rlhf_dyna.checks.values import check_choices, check_values


def _check(alg: AlgorithmConfig, n: int = 8) -> None:
    cfg = Config(algorithm=alg, rollout=RolloutConfig(n=n))
    check_choices(cfg)
    check_values(cfg)
    check_algorithm(cfg, ConfigError)


@pytest.mark.parametrize("alg,n,message", [
    (AlgorithmConfig(adv_estimator="ppo"), 8, "algorithm.adv_estimator='ppo' is not a valid choice"),
    (AlgorithmConfig(adv_estimator="gae"), 8, "gae needs the critic that only algorithm.name=ppo trains"),
    (AlgorithmConfig(name="ppo", adv_estimator="grpo"), 8, "ppo's critic is read only by gae"),
    (AlgorithmConfig(adv_estimator="rloo", name="grpo"), 1, "rollout.n"),
    (AlgorithmConfig(name="ppo", adv_estimator="gae", kl_coef=0.1, kl_in_reward=True, lam=1.5), 8, "algorithm.lam"),
    (AlgorithmConfig(adv_estimator="grpo", kl_coef=0.1, kl_in_reward=True), 8, "kl_in_reward=false"),
    (AlgorithmConfig(kl_ctrl="adaptive"), 8, "kl_coef > 0"),
    (AlgorithmConfig(kl_ctrl="pid"), 8, "algorithm.kl_ctrl='pid' is not a valid choice"),
    (AlgorithmConfig(kl_estimator="k4"), 8, "low_var_kl"),
    (AlgorithmConfig(loss_agg="sum"), 8, "seq_mean_token_sum_norm"),
    (AlgorithmConfig(clip_ratio_c=0.5), 8, "0 (dual-clip off) or > 1"),
    (AlgorithmConfig(entropy_coef=-0.1), 8, "algorithm.entropy_coef=-0.1 is out of range"),
    (AlgorithmConfig(grpo_std="sample"), 8, "population, unbiased"),
])
def test_refused_with_what_is_right(alg, n, message):
    with pytest.raises(ConfigError, match=None) as err:
        _check(alg, n)
    assert message in str(err.value), str(err.value)


@pytest.mark.parametrize("alg,n", [
    (AlgorithmConfig(), 8),
    (AlgorithmConfig(adv_estimator="reinforce_plus_plus", kl_coef=0.05, kl_in_reward=True), 1),
    (AlgorithmConfig(adv_estimator="reinforce_plus_plus_baseline", loss_agg="seq_mean_token_sum_norm"), 4),
    (AlgorithmConfig(adv_estimator="dr_grpo", loss_agg="seq_mean", kl_coef=0.01, kl_ctrl="adaptive"), 8),
    (AlgorithmConfig(name="ppo", adv_estimator="gae", kl_coef=0.01, kl_in_reward=True, clip_ratio_c=0), 8),
])
def test_valid_combinations_pass(alg, n):
    _check(alg, n)
