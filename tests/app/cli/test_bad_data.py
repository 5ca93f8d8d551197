"""Bad data, rewards and checkpoints for task=file fail before spawn, in seconds, with one clear paragraph, and leave
no process behind."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint
from tests.app.app_runs import run_app
from tests.app.marked_processes import marked_processes

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
    lines = data.read_text().splitlines()
    (root / "malformed.jsonl").write_text("\n".join([*lines[:2], '{"prompt": "3 plus 1?", "answer": ', *lines[2:]]) + "\n")
    (root / "empty.jsonl").write_text("")
    (root / "bad_rewards.py").write_text(BAD_REWARDS)
    truncated = make_tiny_checkpoint(root / "truncated", num_hidden_layers=1)
    os.truncate(truncated / "model.safetensors", (truncated / "model.safetensors").stat().st_size // 2)
    return {"root": root, "ckpt": ckpt, "no_template": no_template, "small": small, "data": data, "truncated": truncated}


BAD_REWARDS = """
def raises(prompts, completions, **columns):
    return parse(completions)

def parse(completions):
    raise ValueError("cannot parse the completion")

def one_value(prompts, completions, **columns):
    return [1.0]

def strings(prompts, completions, **columns):
    return ["1.0" for _ in completions]
"""


def run_cli(setup, *args: str) -> subprocess.CompletedProcess:
    return run_app("task=file", "trainer.sft_warmup_steps=0", "tracking.wandb_mode=disabled", "task.eval_files=[]",
                   f"hydra.run.dir={setup['root']}/run", *args, timeout=120, cwd=setup["root"])


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
    ("too_long", lambda s: [f"model.path={s['ckpt']}", f"task.train_files=[{s['data']}]", "task.max_prompt_tokens=510"],
     "task.max_prompt_tokens + rollout.max_new_tokens = 510 + 6 = 516 exceeds the model's max_position_embeddings=512 "
     "("),  # the checkpoint's, from its config.json
    ("max_model_len_too_small", lambda s: [f"model.path={s['ckpt']}", f"task.train_files=[{s['data']}]",
                                           "rollout.max_model_len=128"],
     "= 262 exceeds rollout.max_model_len=128 (vLLM's context); raise rollout.max_model_len to at least 262"),
    # issue 31, item 7: each names the file, row, reward or checkpoint at fault and what would be right
    ("malformed_line", lambda s: [f"model.path={s['ckpt']}", f"task.train_files=[{s['root']}/malformed.jsonl]"],
     "malformed.jsonl line 3 is not valid JSON (Expecting value at column 35): '{\"prompt\": \"3 plus 1?\", \"answer\": '. "
     "Each line of a JSON-lines file must be one JSON object"),
    ("empty_file", lambda s: [f"model.path={s['ckpt']}", f"task.train_files=[{s['root']}/empty.jsonl]"],
     "task.train_files: " + "{root}/empty.jsonl is empty (no rows)"),
    ("reward_raises", lambda s: [f"model.path={s['ckpt']}", f"task.train_files=[{s['data']}]", "task.reward=bad_rewards:raises"],
     "reward 'bad_rewards:raises' raised ValueError while scoring 2 completions; fix the function (its traceback follows)"),
    ("reward_count", lambda s: [f"model.path={s['ckpt']}", f"task.train_files=[{s['data']}]",
                                "task.reward=[math,bad_rewards:one_value]"],
     "reward 'bad_rewards:one_value' returned 1 values for 2 completions"),
    ("reward_strings", lambda s: [f"model.path={s['ckpt']}", f"task.train_files=[{s['data']}]", "task.reward=bad_rewards:strings"],
     "reward 'bad_rewards:strings' returned '1.0' (str) for sample index 0 of the batch; rewards must be numbers"),
    ("truncated_weights", lambda s: [f"model.path={s['truncated']}", f"task.train_files=[{s['data']}]"],
     "{root}/truncated/model.safetensors is not a whole safetensors file"),
    ("kv_cache_too_small", lambda s: [f"model.path={s['ckpt']}", f"task.train_files=[{s['data']}]", "rollout.kv_cache_bytes=100000"],
     "rollout.kv_cache_bytes=100,000 cannot hold one sequence: one sequence of rollout.max_model_len=262 tokens needs "
     "163,840 bytes of KV cache on each rollout rank (1 layers x K and V x 2 KV head(s) x head_dim 32 x 4 bytes, in whole "
     "blocks of 32 tokens plus the block vLLM keeps back). Set rollout.kv_cache_bytes to at least 163840"),
]


@pytest.mark.parametrize("name,args,message", CASES, ids=[c[0] for c in CASES])
def test_bad_data_fails_before_spawn(setup, name, args, message):
    t0 = time.perf_counter()
    proc = run_cli(setup, *args(setup))
    elapsed = time.perf_counter() - t0
    assert proc.returncode != 0
    assert message.replace("{root}", str(setup["root"])) in proc.stderr, proc.stderr[-2000:]
    if name == "reward_raises":  # the reward's own traceback, its exception last, and none of ours
        assert proc.stderr.rstrip().endswith("ValueError: cannot parse the completion"), proc.stderr[-2000:]
        assert "in parse" in proc.stderr and "rlhf_dyna/" not in proc.stderr
    else:
        assert "Traceback" not in proc.stderr
    assert "rank" not in proc.stdout.lower() and not list((setup["root"] / "run").rglob("rank*.log"))
    assert marked_processes(str(setup["root"])) == [], "a process of the refused run is still alive"
    assert elapsed < 60, f"took {elapsed:.1f} s"
