"""Errors that only a rank can meet (a reward that fails on what the model writes) end the run with the reward's own
paragraph and traceback as the last lines a user reads: not the peers' "Connection closed by peer", not vLLM's
"Invalid process group specified" from its exit handlers; and no rank or engine process outlives the run."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint
from tests.app.marked_processes import MARK, marked_processes

# Both pass the check before spawn (called on a row's answer and the empty completion) and fail in the run.
REWARDS = """
def fussy(prompts, completions, answer, **columns):
    for completion, truth in zip(completions, answer):
        if completion not in ("", truth):
            raise KeyError(f"no score for {completion[:12]!r}")
    return [0.0] * len(completions)

def drops_one(prompts, completions, **columns):
    values = [0.0] * len(completions)
    return values if len(completions) <= 2 else values[:-1]
"""
SHUTDOWN_NOISE = ("Invalid process group", "Connection closed by peer", "Connection reset by peer")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("rank_errors")
    ckpt = make_tiny_checkpoint(root / "ckpt", num_hidden_layers=1)
    rows = [{"prompt": [{"role": "user", "content": f"{i} plus 1?"}], "answer": f"#### {i + 1}"} for i in range(8)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "my_rewards.py").write_text(REWARDS)
    return root, ckpt


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("reward,last_line,message", [
    ("fussy", "KeyError: \"no score for", "rlhf_dyna: error: reward 'my_rewards:fussy' raised KeyError while scoring"),
    ("drops_one", "in the order of `completions`.", "rlhf_dyna: error: reward 'my_rewards:drops_one' returned 3 values "
                                                   "for 4 completions"),
])
def test_a_reward_failing_in_a_rank_is_the_last_word(setup, reward, last_line, message):
    root, ckpt = setup
    run_dir = root / f"run_{reward}"
    proc = subprocess.run(
        [sys.executable, "-m", "rlhf_dyna", "recipe=grpo_file", f"model.path={ckpt}", f"task.train_files=[{root}/train.jsonl]",
         "task.eval_files=[]", "task.eval_size=4", "task.prompts_per_step=4", "rollout.n=2", "rollout.max_new_tokens=8",
         "trainer.total_steps=2",
         f"task.reward=my_rewards:{reward}", "tracking.wandb_mode=disabled", f"hydra.run.dir={run_dir}"],
        capture_output=True, text=True, timeout=360, cwd=root, env={**os.environ, MARK: str(run_dir)},
    )
    assert proc.returncode != 0
    err = proc.stderr.rstrip()
    assert message in err and "rlhf_dyna: rank" in err and "failed; stopped the other ranks" in err, err[-3000:]
    assert last_line in err.splitlines()[-1], err[-3000:]
    assert not any(noise in proc.stdout + proc.stderr for noise in SHUTDOWN_NOISE), (proc.stdout + proc.stderr)[-3000:]
    assert marked_processes(str(run_dir)) == [], "a rank or engine process outlived the run"
