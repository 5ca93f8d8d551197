"""The metric names the console shows (the field's habits: reward/mean, actor/pg_loss, timing_s/<phase>)."""
from __future__ import annotations

REWARD_MEAN = "reward/mean"
ACTOR_PG_LOSS = "actor/pg_loss"
ACTOR_KL = "actor/kl"  # KL(policy || reference), not the PPO old/new KL
CRITIC_VF_LOSS = "critic/vf_loss"
RESPONSE_LENGTH_MEAN = "response_length/mean"
EVAL_ACCURACY = "eval/accuracy"
TIMING_STEP = "timing_s/step"
