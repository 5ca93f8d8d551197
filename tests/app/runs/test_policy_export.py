"""End to end: the policy a run exports to <run dir>/policy/ is the trained actor, as an HF dir that `transformers`
and vLLM open, in several safetensors files with an index when the per-file bound asks for it.

The exported tensors equal the actor of the run's last DCP checkpoint bitwise, and greedy decoding of the export
gives the same tokens in `transformers` (`generate`, do_sample=False) as in vLLM. Tied embeddings: the export has
no lm_head.weight and both re-tie it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhf_dyna.tasks.base import make_task
from rlhf_dyna.tasks.tokenizer import CharTokenizer

MAX_TOKENS = 6


def test_exported_policy_is_the_trained_actor_in_transformers_and_vllm(grpo_tiny_run, tmp_path):
    """The run of conftest.grpo_tiny_run: tied embeddings, ~150 KB of fp32 weights in files of at most 60 KB."""
    run_dir, _ = grpo_tiny_run
    policy = run_dir / "policy"
    assert not (run_dir / "policy.tmp").exists()
    index = json.loads((policy / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and all((policy / f).is_file() for f in files)
    exported = {k: v for f in files for k, v in load_file(str(policy / f)).items()}
    assert "lm_head.weight" not in exported  # tied: HF and vLLM re-tie

    dcp_to_torch_save(run_dir / "checkpoints" / "step_2", tmp_path / "actor.pt")
    trained = torch.load(tmp_path / "actor.pt", weights_only=False)["actor"]["model"]
    assert set(exported) == set(trained) - {"lm_head.weight"}
    for name, tensor in exported.items():
        assert torch.equal(tensor, trained[name]), name

    tokenizer = CharTokenizer.load(policy)
    AutoTokenizer.from_pretrained(policy)  # the HF tokenizer files are there too
    task = make_task("arithmetic", seed=0, eval_size=16, partial_credit=False, min_digits=1, max_digits=2)
    prompts = [tokenizer.encode(e.prompt, add_bos=True) for e in task.eval_set()[:8]]
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    hf = []
    for ids in prompts:
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=MAX_TOKENS, pad_token_id=tokenizer.pad_id)
        hf.append(out[0, len(ids):].tolist())
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "ERROR"}
    vllm = subprocess.run([sys.executable, "-m", "tests.app.runs.vllm_greedy", str(policy), json.dumps(prompts), str(MAX_TOKENS)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert vllm.returncode == 0, vllm.stdout[-3000:] + vllm.stderr[-3000:]
    line = next(l for l in vllm.stdout.splitlines() if l.startswith("GREEDY "))
    assert json.loads(line[len("GREEDY "):]) == hf  # both stop at the config's eos, which they then include
    assert sum(len(t) > 1 for t in hf) >= len(hf) // 2, f"mostly empty answers compare nothing: {hf}"
