"""Checks of `algorithm.*` that span several keys (estimator vs. critic, KL placement, group size)."""
from __future__ import annotations

from ..algos.choices import ADV_ESTIMATORS, GROUP_BASELINE, SEQUENCE_LEVEL
from ..config import Config
from .errors import ConfigError


def check_algorithm(cfg: Config, error: type[Exception] = ConfigError) -> None:
    alg, n = cfg.algorithm, cfg.rollout.n
    est = alg.adv_estimator
    if est not in ADV_ESTIMATORS:
        raise error(f"algorithm.adv_estimator={est!r} is not a valid choice; valid: {', '.join(ADV_ESTIMATORS)}.")
    if (est == "gae") != (alg.name == "ppo"):
        raise error(
            f"algorithm.adv_estimator={est} with algorithm.name={alg.name}: gae needs the critic that only "
            f"algorithm.name=ppo trains, and ppo's critic is read only by gae. Use algorithm=ppo (adv_estimator=gae), "
            f"or algorithm=grpo with adv_estimator among {', '.join(e for e in ADV_ESTIMATORS if e != 'gae')}."
        )
    if est in GROUP_BASELINE and n < 2:
        raise error(
            f"algorithm.adv_estimator={est} with rollout.n={n}: its baseline comes from the other samples of the "
            f"same prompt, so it needs rollout.n >= 2 (e.g. 8); adv_estimator=reinforce_plus_plus works with n=1."
        )
    if est in SEQUENCE_LEVEL and alg.kl_in_reward and alg.kl_coef > 0:
        raise error(
            f"algorithm.kl_in_reward=true with adv_estimator={est}: a sequence-level estimator has no per-token "
            f"rewards to put the KL in. Set algorithm.kl_in_reward=false (the KL then goes into the loss), or use "
            f"adv_estimator=reinforce_plus_plus, reinforce_plus_plus_baseline or gae."
        )
    if alg.kl_ctrl == "adaptive" and alg.kl_coef <= 0:
        raise error(
            f"algorithm.kl_ctrl=adaptive with algorithm.kl_coef={alg.kl_coef}: the controller scales the initial "
            f"coefficient, and 0 stays 0 (no reference model is built). Set algorithm.kl_coef > 0 (e.g. 0.01)."
        )
