"""End to end: the pipeline-parallel recipe (pp2 x dp2 on 4 local ranks, vLLM rollout tp2) runs with the real app,
switches online to dp4 and back to pp2 x dp2, logs the predicted bubble fraction and syncs vLLM from the pp layout.
Its last step is saved from the pp layout: a DCP checkpoint under the HF names (every stage's parameters and AdamW
state, layout-free) and the exported policy, which equals the checkpoint's actor tensor for tensor."""
from __future__ import annotations

import json

import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.app.app_runs import read_metrics, run_app

RUN = ["recipe=grpo_tiny_pp", "trainer.total_steps=3", "trainer.sft_warmup_steps=4", "task.eval_size=16",
       "task.eval_every=1", "task.partial_credit=true", "tracking.wandb_mode=disabled"]
SCHEDULE = "parallel.schedule=[{step: 2, pp: 1}, {step: 3, pp: 2}]"  # dp=-1 fills the world: dp4, then pp2 x dp2


def test_pipeline_recipe_runs_and_switches(tmp_path):
    run_dir = tmp_path / "pp"
    proc = run_app(*RUN, SCHEDULE, f"hydra.run.dir={run_dir}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    # 32 prompts x 8 samples / dp2 = 128 rows per dp rank, 16-row micro-batches: m=8, p=2 -> (p-1)/(m+p-1) = 1/9
    assert abs(rows[1]["pp/bubble_fraction"] - 1 / 9) < 1e-12 and abs(rows[3]["pp/bubble_fraction"] - 1 / 9) < 1e-12
    assert "pp/bubble_fraction" not in rows[2]  # the dp4 step has no pipeline
    for row in rows[1:]:
        # one mini-batch: the new policy is the old one, so the ratio is 1 iff the forward-only log-probs (old) agree
        # with the training forward, in every layout
        assert abs(row["actor/ratio_mean"] - 1.0) < 1e-5, row
        assert row["reshard/train_to_rollout/bytes_moved"] > 0
    assert rows[2]["reshard/train_relayout/bytes_moved"] > 0 and rows[3]["reshard/train_relayout/bytes_moved"] > 0
    assert "training layout pp2xdp2xtp1-zero3 -> dp4xtp1-zero3" in proc.stdout
    assert "training layout dp4xtp1-zero3 -> pp2xdp2xtp1-zero3" in proc.stdout

    step3 = run_dir / "checkpoints" / "step_3"  # save_last, in pp2 x dp2
    assert json.loads((step3 / "COMPLETE").read_text())["layout"] == {"pp": 2, "dp": 2, "tp": 1, "zero": 3}
    dcp_to_torch_save(step3, tmp_path / "ckpt.pt")
    actor = torch.load(tmp_path / "ckpt.pt", weights_only=False)["actor"]
    index = json.loads((run_dir / "policy" / "model.safetensors.index.json").read_text())
    exported = {k: v for f in set(index["weight_map"].values()) for k, v in load_file(str(run_dir / "policy" / f)).items()}
    assert set(exported) == set(actor["model"]) and "model.layers.2.mlp.up_proj.weight" in exported  # both stages
    for name, tensor in exported.items():
        assert torch.equal(tensor, actor["model"][name]), name
    assert {k for k in actor["optim"] if k.endswith(".exp_avg_sq")} == {f"state.{n}.exp_avg_sq" for n in exported}


def test_bad_pipeline_settings_are_refused_before_spawn():
    proc = run_app("recipe=grpo_tiny_pp", "parallel.train.pp=4", "model.num_hidden_layers=3", timeout=120)
    assert proc.returncode != 0 and "pp=4 exceeds model.num_hidden_layers=3" in proc.stdout + proc.stderr
    proc = run_app("recipe=grpo_tiny_pp", "algorithm.micro_batch_size=128", timeout=120)
    assert proc.returncode != 0 and "1F1B needs at least pp=2" in proc.stdout + proc.stderr
