"""The real app under torchrun: two agents on loopback (--nnodes 2) rendezvous and train together."""
from __future__ import annotations

import json
import subprocess
import sys

from rlhf_dyna.launch import free_port


def test_app_under_two_torchrun_agents(tmp_path):
    port = free_port()
    agents = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", tmp_path.name,
             "--node-rank", str(node), "--max-restarts", "0",
             "-m", "rlhf_dyna", "trainer.total_steps=1", "trainer.sft_warmup_steps=0", "task.prompts_per_step=8",
             "task.eval_size=16", "tracking.wandb_mode=disabled",
             f"hydra.run.dir={tmp_path}/node{node}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for node in (0, 1)
    ]
    outputs = [agent.communicate(timeout=400)[0] for agent in agents]
    assert [a.returncode for a in agents] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    rows = [json.loads(line) for line in (tmp_path / "node0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[-1]["reshard/train_to_rollout/bytes_moved"] > 0
    assert (tmp_path / "node0" / "model_init" / "node0" / "config.json").is_file()
    assert (tmp_path / "node0" / "model_init" / "node1" / "config.json").is_file()
    assert not (tmp_path / "node1" / "metrics.jsonl").exists(), "only rank 0 tracks"
    # rank 0's own lines on its agent's console; everything else in the rank logs under rank 0's run dir
    assert f"rank logs in {tmp_path / 'node0' / 'logs'}" in outputs[0] and "step 1/1 | reward/mean" in outputs[0]
    for noise in ("Triton", "FutureWarning", "NUMA", "Loading safetensors"):
        assert noise not in outputs[0] + outputs[1], noise
    assert all((tmp_path / "node0" / "logs" / f"rank{r}.log").is_file() for r in (0, 1))
