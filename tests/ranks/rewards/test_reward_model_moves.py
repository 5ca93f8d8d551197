"""The reward model as a placed role, on 2 gloo ranks: its VPS catalog (the score head in place of lm_head) binds its
live FSDP2 shards, so a VPS role move re-shards it (dp2 -> tp2) and it scores the same; parked in host memory and
copied back (reward_model.offload), its storage is freed in between and it scores the same after."""
from __future__ import annotations

import json

import pytest

from rlhf_dyna.models.tiny_checkpoint import make_tiny_reward_model
from tests.multirank import run_ranks
from tests.ranks.rewards.test_reward_scores import COMPLETIONS, PROMPTS


def _moves(rank: int, world: int, path: str, out: str) -> None:
    from rlhf_dyna.config import Config
    from rlhf_dyna.orchestrator.build import build_reward_engine
    from rlhf_dyna.orchestrator.reward_scoring import score_rows
    from rlhf_dyna.parallel_layout import ParallelLayout
    from rlhf_dyna.tasks.hf_tokenizer import HFTokenizer
    from rlhf_dyna.tasks.reward_text import reward_ids
    from rlhf_dyna.train.mesh import build_mesh
    from rlhf_dyna.transition.host_offload import HostCopy
    from rlhf_dyna.transition.role_move import engine_on, move_role_state, role_catalog, state_storages

    cfg = Config()
    cfg.reward_model.path, cfg.trainer.precision = path, "fp32"
    dp2, tp2 = ParallelLayout(2, 1), ParallelLayout(1, 2)
    home = build_reward_engine(cfg, build_mesh(dp2))
    tokenizer = HFTokenizer(path)
    rows = [reward_ids(tokenizer, p, c) for p, c in zip(PROMPTS, COMPLETIONS)]
    pad = home.model.config.pad_token_id
    result = {"before": score_rows(home, rows, len(rows), pad)}
    moved = engine_on(home, build_mesh(tp2))
    stats = move_role_state(home, moved, dp2.spec(), tp2.spec(), role_catalog(home))
    result["bytes_moved"] = stats.bytes_moved
    result["moved"] = score_rows(moved, rows, len(rows), pad)
    host = HostCopy(home)
    parked = host.park()
    result["parked_bytes"] = parked.bytes_copied
    result["freed"] = all(s.nbytes() == 0 for s in state_storages(home).values())
    host.unpark()
    result["unparked"] = score_rows(home, rows, len(rows), pad)
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)


def test_reward_model_moves_and_parks_keep_its_scores(tmp_path):
    path = str(make_tiny_reward_model(tmp_path / "rm", initializer_range=0.2))
    out = str(tmp_path / "moves")
    run_ranks(_moves, 2, path, out)
    for rank in range(2):
        got = json.loads(open(f"{out}.{rank}").read())
        assert got["bytes_moved"] > 0 and got["parked_bytes"] > 0 and got["freed"]
        assert got["moved"] == pytest.approx(got["before"], rel=1e-5, abs=1e-5)
        assert got["unparked"] == got["before"]
