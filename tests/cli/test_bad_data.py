"""Bad data, rewards and checkpoints for task=file fail before spawn, in seconds, with one clear paragraph."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint

ROWS = [{"prompt": [{"role": "user", "content": f"{i} plus 1?"}], "answer": f"#### {i + 1}", "kind": "add"} for i in range(4)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_data")
    ckpt = make_tiny_checkpoint(root / "ckpt", num_hidden_layers=1)
    no_template = make_tiny_checkpoint(root / "no_template", num_hidden_layers=1, chat_template=False)
    small = make_tiny_checkpoint(root / "small_embedding", num_hidden_layers=1)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 64}))
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return {"root": root, "ckpt": ckpt, "no_template": no_template, "small": small, "data": data}


def run_cli(setup, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rlhf_dyna", "task=file", "trainer.sft_warmup_steps=0", "tracking.wandb_mode=disabled", "task.eval_files=[]",
           f"hydra.run.dir={setup['root']}/run", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=setup["root"])


CASES = [
    ("missing_file", lambda s: [f"model.path={s['ckpt']}", "task.train_files=[/nonexistent/train.jsonl]"],
     "task.train_files: 1 file(s) do not exist: /nonexistent/train.jsonl"),
    ("missing_column", lambda s: [f"model.path={s['ckpt']}", f"task.train_files=[{s['data']}]", "task.prompt_key=question"],
     "task.prompt_key='question' is not a column of task.train_files"),
    ("columns_listed", lambda s: [f"model.path={s['ckpt']}", f"task.train_files=[{s['data']}]", "task.answer_key=solution"],
     "the columns there are: prompt, answer, kind"),
    ("reward_import", lambda s: [f"model.path={s['ckpt']}", f"task.train_files=[{s['data']}]", "task.reward=[math,no_such_rewards:fmt]"],
     "module 'no_such_rewards' does not import"),
    ("tokenizer_too_big", lambda s: [f"model.path={s['small']}", f"task.train_files=[{s['data']}]"],
     "but the model's embedding (config.json vocab_size) has 64 rows"),
    ("no_chat_template", lambda s: [f"model.path={s['no_template']}", f"task.train_files=[{s['data']}]"],
     "holds chat messages but the tokenizer of model.path="),
    ("no_model_path", lambda s: [f"task.train_files=[{s['data']}]"], "task=file needs model.path=DIR"),
]


@pytest.mark.parametrize("name,args,message", CASES, ids=[c[0] for c in CASES])
def test_bad_data_fails_before_spawn(setup, name, args, message):
    t0 = time.perf_counter()
    proc = run_cli(setup, *args(setup))
    elapsed = time.perf_counter() - t0
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "rank" not in proc.stdout.lower()
    assert elapsed < 60, f"took {elapsed:.1f} s"
