"""Checks of `algorithm.*` that span several keys, read from the estimators' registrations (algos.estimators):
the critic an estimator needs, its group size, where the KL penalty can go."""
from __future__ import annotations

from ..algos.estimators import ESTIMATORS, SEQUENCE
from ..config import Config
from ..errors import ConfigError


def check_algorithm(cfg: Config, error: type[Exception] = ConfigError) -> None:
    alg, n = cfg.algorithm, cfg.rollout.n
    if alg.adv_estimator not in ESTIMATORS:
        raise error(f"algorithm.adv_estimator={alg.adv_estimator!r} is not a valid choice; valid: "
                    f"{', '.join(ESTIMATORS)}.")
    est = ESTIMATORS[alg.adv_estimator]
    with_critic = [e.name for e in ESTIMATORS.values() if e.needs_critic]
    if est.needs_critic != (alg.name == "ppo"):
        without = [e.name for e in ESTIMATORS.values() if not e.needs_critic]
        need = f"{est.name} needs the critic that only algorithm.name=ppo trains" if est.needs_critic else \
            f"algorithm.name=ppo trains a critic, and ppo's critic is read only by {', '.join(with_critic)}"
        raise error(
            f"algorithm.adv_estimator={est.name} with algorithm.name={alg.name}: {need}. Use algorithm=ppo "
            f"(adv_estimator among {', '.join(with_critic)}), or algorithm=grpo with adv_estimator among "
            f"{', '.join(without)}."
        )
    if est.group_baseline and n < 2:
        alone = [e.name for e in ESTIMATORS.values() if not e.group_baseline and not e.needs_critic]
        raise error(
            f"algorithm.adv_estimator={est.name} with rollout.n={n}: its baseline comes from the other samples of the "
            f"same prompt, so it needs rollout.n >= 2 (e.g. 8); adv_estimator={' or '.join(alone)} works with n=1."
        )
    if est.level == SEQUENCE and alg.kl_in_reward and alg.kl_coef > 0:
        per_token = [e.name for e in ESTIMATORS.values() if e.level != SEQUENCE]
        raise error(
            f"algorithm.kl_in_reward=true with adv_estimator={est.name}: a sequence-level estimator has no per-token "
            f"rewards to put the KL in. Set algorithm.kl_in_reward=false (the KL then goes into the loss), or use "
            f"adv_estimator among {', '.join(per_token)}."
        )
    if alg.kl_ctrl == "adaptive" and alg.kl_coef <= 0:
        raise error(
            f"algorithm.kl_ctrl=adaptive with algorithm.kl_coef={alg.kl_coef}: the controller scales the initial "
            f"coefficient, and 0 stays 0 (no reference model is built). Set algorithm.kl_coef > 0 (e.g. 0.01)."
        )
