from rlhf_dyna.tracking import names


def test_design_names():
    assert (names.REWARD_MEAN, names.ACTOR_PG_LOSS, names.CRITIC_VF_LOSS, names.ACTOR_KL) == (
        "reward/mean", "actor/pg_loss", "critic/vf_loss", "actor/kl",
    )
    assert (names.RESPONSE_LENGTH_MEAN, names.EVAL_ACCURACY) == ("response_length/mean", "eval/accuracy")
