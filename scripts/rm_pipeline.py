"""The classic RLHF pipeline on this machine's CPU ranks: preference pairs made in code (the completion with more
sevens is preferred, examples/sevens.py), a reward model trained on them (recipe=reward_tiny), then PPO rewarded by
that reward model with its critic initialised from it (recipe=ppo_rm_tiny). The preference is measured along the way
by the rule that made the pairs (sevens per completion), without the reward model. Writes
docs/bench/rm_pipeline.json and docs/bench/rm_pipeline.png.

    python scripts/rm_pipeline.py                    # about 5 minutes on 2 cores
    python scripts/rm_pipeline.py --rm-steps 40 --ppo-steps 15 --out /tmp/rm_pipeline   # shorter (tests)
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # examples.sevens and rlhf_dyna from this checkout

from examples.sevens import write_data  # noqa: E402
from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint  # noqa: E402

OUT = REPO / "docs" / "bench"
RM_KEYS = ("reward_model/loss", "reward_model/accuracy", "eval/accuracy", "eval/margin")
PPO_KEYS = ("reward/rm/mean", "reward/count_sevens/mean", "eval/reward", "critic/vf_loss", "actor/kl",
            "response_length/mean", "timing_s/reward_model", "timing_s/step")


def run_app(run_dir: Path, *overrides: str) -> list[dict]:
    """One run of the real app from the repository root (examples.sevens imports from there); its metrics."""
    cmd = [sys.executable, "-m", "rlhf_dyna", *overrides, "tracking.wandb_mode=disabled", "tracking.console=plain",
           f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=REPO)
    if proc.returncode:
        raise SystemExit(f"{' '.join(overrides[:2])} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def curve(rows: list[dict], keys: tuple[str, ...]) -> list[dict]:
    return [{"step": r["step"], **{k: r[k] for k in keys if k in r}} for r in rows]


def window_mean(rows: list[dict], key: str, first: bool, n: int = 5) -> float:
    values = [r[key] for r in rows if key in r]
    part = values[:n] if first else values[-n:]
    return sum(part) / len(part)


def run_pipeline(work: Path, rm_steps: int, ppo_steps: int, seed: int = 0) -> dict:
    base = make_tiny_checkpoint(work / "base")
    data = write_data(base, work / "data", seed=seed)
    t0 = time.perf_counter()
    rm_rows = run_app(work / "reward_model_run", "recipe=reward_tiny", f"model.path={base}",
                      f"trainer.total_steps={rm_steps}", f"task.train_files=[{data['pairs_train']}]",
                      f"task.eval_files=[{data['pairs_eval']}]", f"trainer.seed={seed}")
    rm_seconds = time.perf_counter() - t0
    rm_dir = work / "reward_model_run" / "reward_model"
    t0 = time.perf_counter()
    ppo_rows = run_app(work / "ppo_run", "recipe=ppo_rm_tiny", f"model.path={base}", f"reward_model.path={rm_dir}",
                       f"trainer.total_steps={ppo_steps}", f"task.train_files=[{data['prompts_train']}]",
                       f"task.eval_files=[{data['prompts_eval']}]", f"trainer.seed={seed}")
    ppo_seconds = time.perf_counter() - t0
    trained = [r for r in ppo_rows if r["step"] > 0]
    summary = {
        "rm_heldout_accuracy_start": rm_rows[0]["eval/accuracy"],
        "rm_heldout_accuracy_end": rm_rows[-1]["eval/accuracy"],
        **{f"ppo_{name}_{end}": window_mean(trained, key, first=end == "first5")
           for name, key in (("rm_mean", "reward/rm/mean"), ("sevens_per_completion", "reward/count_sevens/mean"))
           for end in ("first5", "last5")},
        "rm_seconds": rm_seconds, "ppo_seconds": ppo_seconds,
    }
    return {"summary": summary, "reward_model": curve(rm_rows, RM_KEYS), "ppo": curve(ppo_rows, PPO_KEYS)}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    rm = [r for r in result["reward_model"] if "eval/accuracy" in r]
    axes[0].plot([r["step"] for r in rm], [r["eval/accuracy"] for r in rm], marker="o")
    axes[0].set(title="reward model: held-out pair accuracy", xlabel="step", ylim=(0, 1.05))
    ppo = [r for r in result["ppo"] if r["step"] > 0]
    axes[1].plot([r["step"] for r in ppo], [r["reward/rm/mean"] for r in ppo])
    axes[1].set(title="PPO: reward/rm/mean (the reward model's score)", xlabel="step")
    axes[2].plot([r["step"] for r in ppo], [r["reward/count_sevens/mean"] for r in ppo], color="tab:green")
    axes[2].set(title="PPO: sevens per completion (the rule, no reward model)", xlabel="step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rm-steps", type=int, default=120)
    parser.add_argument("--ppo-steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(OUT), help="where rm_pipeline.json and .png go")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rm_pipeline_") as tmp:
        result = run_pipeline(Path(tmp), args.rm_steps, args.ppo_steps, args.seed)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{platform.node()} ({platform.processor() or platform.machine()}, 2 CPU cores shared)",
              "commands": ["python -m rlhf_dyna recipe=reward_tiny model.path=BASE",
                           "python -m rlhf_dyna recipe=ppo_rm_tiny model.path=BASE "
                           "reward_model.path=RM_RUN/reward_model"],
              "rm_steps": args.rm_steps, "ppo_steps": args.ppo_steps, "seed": args.seed, **result}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rm_pipeline.json").write_text(json.dumps(result, indent=2))
    plot(result, out / "rm_pipeline.png")
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {out / 'rm_pipeline.json'} and {out / 'rm_pipeline.png'}")


if __name__ == "__main__":
    main()
