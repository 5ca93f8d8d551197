"""The planner in fresh interpreters: importing it loads no torch, and a plan's digest does not depend on the
process (its hash seed)."""
from __future__ import annotations

import subprocess
import sys


def test_vps_imports_no_torch():
    code = "import sys, rlhf_dyna.vps; assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


DIGEST_SCRIPT = """
from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.vps.cache import plan_digest
from rlhf_dyna.vps.layout import build_layout
from rlhf_dyna.vps.plan import build_plan
from rlhf_dyna.vps.spec import ParallelSpec, Phase
from types import SimpleNamespace
cfg = SimpleNamespace(model_type="qwen3_moe", num_hidden_layers=3, hidden_size=7, num_attention_heads=4,
    num_key_value_heads=2, head_dim=3, intermediate_size=6, vocab_size=101, tie_word_embeddings=False,
    num_experts=5, moe_intermediate_size=4, mlp_only_layers=[], decoder_sparse_step=1)
c = catalog_from_config(cfg)
src = build_layout(c, ParallelSpec(pp=2, dp=3, tp=2, ep=2, etp=1, zero=3), (ParallelSpec().kinds[0],))
dst = build_layout(c, ParallelSpec(phase=Phase.ROLLOUT, dp=3, tp=4, ep=1))
print(plan_digest(build_plan(src, dst, 4)))
"""


def test_plan_identical_in_another_process():
    outs = [subprocess.run([sys.executable, "-c", DIGEST_SCRIPT], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": str(seed), "PATH": ""}).stdout for seed in (1, 2)]
    exec_ns: dict = {}
    here = DIGEST_SCRIPT.replace("print(plan_digest(build_plan(src, dst, 4)))", "d = plan_digest(build_plan(src, dst, 4))")
    exec(here, exec_ns)
    assert outs[0].strip() == outs[1].strip() == exec_ns["d"]
