import pytest
import torch

from rlhf_dyna.tracking import names


def test_design_names():
    assert names.timing("generation") == "timing_s/generation"
    assert names.reshard("actor_train_to_rollout", "bytes_moved") == "reshard/actor_train_to_rollout/bytes_moved"
    assert [names.reshard("t", f) for f in names.RESHARD_FIELDS] == [
        "reshard/t/seconds", "reshard/t/bytes_moved", "reshard/t/rounds", "reshard/t/peak_extra_bytes",
    ]
    assert (names.REWARD_MEAN, names.ACTOR_PG_LOSS, names.CRITIC_VF_LOSS, names.ACTOR_KL) == (
        "reward/mean", "actor/pg_loss", "critic/vf_loss", "actor/kl",
    )
    assert (names.RESPONSE_LENGTH_MEAN, names.EVAL_ACCURACY) == ("response_length/mean", "eval/accuracy")


@pytest.mark.parametrize("bad", ["", "a/b"])
def test_bad_segments_rejected(bad):
    with pytest.raises(ValueError):
        names.timing(bad)
    with pytest.raises(ValueError):
        names.reshard(bad, "seconds")


def test_unknown_reshard_field_rejected():
    with pytest.raises(ValueError, match="peak_extra_bytes"):
        names.reshard("t", "latency")


def test_prefixed_converts_tensors_to_floats():
    out = names.prefixed("actor", {"pg_loss": torch.tensor(0.25), "pg_clipfrac": 0.5})
    assert out == {"actor/pg_loss": 0.25, "actor/pg_clipfrac": 0.5}
    assert all(type(v) is float for v in out.values())
