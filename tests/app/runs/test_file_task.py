"""End to end: a real tiny HF checkpoint (BPE tokenizer, ChatML template, two stop ids) trained with GRPO on
chat prompts from a jsonl file, rewarded by `math` plus a custom reward module in the working directory."""
from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint
from tests.app.app_runs import run_app

RECORDER = '''
import json, os

def record(prompts, completions, answer, kind, **columns):
    with open(f"reward_calls_{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps({"prompts": prompts, "completions": completions, "answer": answer, "kind": kind}) + "\\n")
    return [1.0] * len(completions)
'''


def chat_rows(n: int, offset: int) -> list[dict]:
    return [{"prompt": [{"role": "system", "content": "Answer with #### N."},
                        {"role": "user", "content": f"What is {i} plus {i + 1}?"}],
             "answer": f"#### {2 * i + 1}", "kind": f"k{i}"} for i in range(offset, offset + n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_file_task_trains_a_real_checkpoint_on_chat_prompts(tmp_path):
    from transformers import AutoTokenizer

    ckpt = make_tiny_checkpoint(tmp_path / "ckpt", arch="llama")
    train, evals = chat_rows(8, 0), chat_rows(4, 100)
    train_file, eval_file = write_jsonl(tmp_path / "train.jsonl", train), write_jsonl(tmp_path / "eval.jsonl", evals)
    (tmp_path / "my_rewards.py").write_text(RECORDER)
    run_dir = tmp_path / "run"
    proc = run_app(*[
        "task=file", f"model.path={ckpt}", f"task.train_files=[{train_file}]",
        f"task.eval_files=[{eval_file}]", "task.reward=[math,my_rewards:record]", "task.reward_weights=[1.0,0.5]",
        "trainer.total_steps=2", "trainer.sft_warmup_steps=0", "task.prompts_per_step=4", "rollout.n=2",
        "rollout.max_new_tokens=8", "task.eval_size=4", "task.eval_every=2", "algorithm.micro_batch_size=8",
        "task.max_prompt_tokens=96", "tracking.wandb_mode=disabled", "tracking.sample_log=8",
        f"hydra.run.dir={run_dir}",
    ], timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    tok = AutoTokenizer.from_pretrained(str(ckpt))
    templated = {tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False): r for r in train}
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {1, 2} and len(samples) == 16
    for s in samples:  # the ids vLLM received are the chat-templated prompt, special tokens included
        assert s["prompt_text"] in templated, s["prompt_text"]
        assert "<|im_start|>assistant\n" in s["prompt_text"]
        assert s["prompt_ids"] == tok(s["prompt_text"], add_special_tokens=False)["input_ids"]

    files = {p: [json.loads(line) for line in p.read_text().splitlines()] for p in tmp_path.glob("reward_calls_*.jsonl")}
    probes = [p for p, rows in files.items() if [r["completions"] for r in rows] == [[train[0]["answer"], ""]]]
    assert len(probes) == 1, "the launcher tries a custom reward once before spawn, on the first row's answer and ''"
    calls = [call for p, rows in files.items() if p not in probes for call in rows]
    assert len(files) == 3, "each rank scores its own share"
    completions = {c for call in calls for c in call["completions"]}
    for s in samples:  # the reward got the decoded completions ...
        assert s["response_text"] in completions
    answer_of = {json.dumps(r["prompt"]): (r["answer"], r["kind"]) for r in train + evals}
    for call in calls:  # ... and the answer and extra columns of each completion's own prompt
        assert len(call["prompts"]) == len(call["completions"]) == len(call["answer"]) == len(call["kind"])
        for prompt, answer, kind in zip(call["prompts"], call["answer"], call["kind"]):
            assert answer_of[json.dumps(prompt)] == (answer, kind)

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    resolved = OmegaConf.load(run_dir / "config_resolved.yaml")  # the checkpoint's architecture, as it ran
    assert (resolved.model.vocab_size, resolved.model.hidden_size, resolved.model.max_position_embeddings) == (384, 128, 512)
    assert resolved.rollout.max_model_len == 96 + 8  # task.max_prompt_tokens + rollout.max_new_tokens
    for r in rows[1:]:
        assert r["reward/record/mean"] == 1.0
        assert abs(r["reward/mean"] - (r["reward/math/mean"] + 0.5)) < 1e-9
    assert 0.0 <= rows[-1]["eval/accuracy"] <= 1.0 and "actor/pg_loss" in rows[-1]
