"""Running the real app (`python -m rlhf_dyna`) and reading what a run writes.

`run_app` and `run_cli` fork the app from the tests' forkserver (tests/forkserver.py), which imported what the
launcher imports: the child is `python -m rlhf_dyna ARGS` as runpy runs it (argv, environment, its own session, its
output to files), without ~10 s of imports per run. What only a fresh interpreter shows (import-time notices, the
environment in /proc that tests/app/marked_processes.py reads) is tested with real interpreters: torchrun, the
fresh-interpreter checks, the runtime and elastic runs (tests/app/runtimes/placed_runs.run)."""
from __future__ import annotations

import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.forkserver import forkserver

SHORT = ["trainer.total_steps=2", "trainer.sft_warmup_steps=2", "task.eval_size=16", "task.eval_every=1"]
REQUIRED = [
    "timing_s/gen", "timing_s/train", "timing_s/weight_sync", "reshard/train_to_rollout/seconds",
    "reshard/train_to_rollout/bytes_moved", "reward/mean", "eval/accuracy", "actor/pg_loss", "response_length/mean",
    "response_length/max", "response_length/clip_ratio", "actor/entropy", "actor/pg_clipfrac", "actor/pg_clipfrac_lower",
    "advantage/mean", "advantage/std", "perf/gen_tokens_per_s", "perf/train_tokens_per_s",
]
COMPARED = ("actor/", "critic/", "reward/", "response_length/", "eval/")  # what a placement or a resume must not change


def _app_main(args: list[str], env: dict[str, str], cwd: str | None, out: str, err: str) -> None:
    """In the forked child: what `python -m rlhf_dyna *args` does in `cwd`, with stdout and stderr to files."""
    os.setsid()  # as a subprocess of its own: a timeout stops its whole session
    if cwd is not None:
        os.chdir(cwd)
    sys.path[0] = os.getcwd()  # `python -m` puts the working directory first (task.reward=my_module:fn imports there)
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["rlhf_dyna", *args]
    runpy.run_module("rlhf_dyna", run_name="__main__", alter_sys=True)  # exits with the app's code


def run_app(*args: str, timeout: int = 400, env: dict[str, str] | None = None, cwd: str | Path | None = None,
            ) -> subprocess.CompletedProcess:
    """`python -m rlhf_dyna *args` in `cwd`, forked from the tests' forkserver; its exit code and output."""
    cmd = [sys.executable, "-m", "rlhf_dyna", *args]
    with tempfile.TemporaryDirectory(prefix="rlhf_dyna_app_") as tmp:
        out, err = f"{tmp}/stdout", f"{tmp}/stderr"
        Path(out).touch(), Path(err).touch()  # a child that fails before it opens them still reads as empty output
        child = forkserver().Process(target=_app_main, args=(list(args), dict(os.environ if env is None else env),
                                                               None if cwd is None else str(cwd), out, err))
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.join()
            raise subprocess.TimeoutExpired(cmd, timeout, Path(out).read_text(), Path(err).read_text())
        return subprocess.CompletedProcess(cmd, child.exitcode, Path(out).read_text(), Path(err).read_text())


def run_cli(*args: str, tmp_path, timeout: int = 60) -> subprocess.CompletedProcess:
    """The app in tmp_path/run without wandb: for refusals, which must come before any rank starts."""
    return run_app(*args, f"hydra.run.dir={tmp_path}/run", "tracking.wandb_mode=disabled", timeout=timeout)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_recipe_outputs(run_dir: Path, stdout: str, recipe: str, steps: int, extra_keys: list[str]) -> None:
    """What every run writes: one metrics row per step with the required keys, the resolved config, an offline wandb
    run, and the launch line."""
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(steps + 1))
    for key in REQUIRED + extra_keys:
        assert key in rows[-1], f"{key} missing from {sorted(rows[-1])}"
    assert rows[-1]["reshard/train_to_rollout/bytes_moved"] > 0
    assert 0.0 <= rows[-1]["eval/accuracy"] <= 1.0
    assert (run_dir / "config_resolved.yaml").is_file() and (run_dir / ".hydra" / "config.yaml").is_file()
    assert list((run_dir / "wandb").glob("offline-run-*")), "no offline wandb run"
    assert f"recipe {recipe}, 2 local ranks" in stdout
