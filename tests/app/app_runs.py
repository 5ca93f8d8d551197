"""Running the real app (`python -m rlhf_dyna`) and reading what a run writes.

`run_app`, `run_cli` and `AppProcess` fork the app from the tests' forkserver (tests/forkserver.py), which imported
what the launcher imports: the child is `python -m rlhf_dyna ARGS` as runpy runs it (argv, environment, its own
session, its output to files), without seconds of imports per run. A run whose processes a test looks for afterwards
runs in its run directory, which marks them (tests/app/marked_processes.py). What only a fresh interpreter shows
(import-time notices) is tested with real interpreters: torchrun and the fresh-interpreter checks."""
from __future__ import annotations

import json
import os
import runpy
import shutil
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
    """In the forked child: what `python -m rlhf_dyna *args` does in `cwd`, with stdout and stderr to files (one file
    for both where `out` is `err`)."""
    os.setsid()  # as a subprocess of its own: a timeout stops its whole session
    if cwd is not None:
        os.chdir(cwd)
    sys.path[0] = os.getcwd()  # `python -m` puts the working directory first (task.reward=my_module:fn imports there)
    os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    os.dup2(1 if err == out else os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["rlhf_dyna", *args]
    runpy.run_module("rlhf_dyna", run_name="__main__", alter_sys=True)  # exits with the app's code


class AppProcess:
    """`python -m rlhf_dyna *args` forked from the tests' forkserver and running, in `cwd` (which marks its processes:
    tests/app/marked_processes.py): the part of subprocess.Popen the tests use. Its stdout and stderr go to files, or
    both to `output`."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None,
                 output: Path | None = None):
        self.args = [sys.executable, "-m", "rlhf_dyna", *args]
        self._tmp = tempfile.mkdtemp(prefix="rlhf_dyna_app_")
        self._out, self._err = (str(output),) * 2 if output is not None else (f"{self._tmp}/stdout", f"{self._tmp}/stderr")
        for path in {self._out, self._err}:
            Path(path).write_text("")  # a child that fails before it opens them still reads as empty output
        self._child = forkserver().Process(target=_app_main, args=(list(args), dict(os.environ if env is None else env),
                                                                   None if cwd is None else str(cwd), self._out,
                                                                   self._err))
        self._child.start()
        self.pid = self._child.pid

    @property
    def returncode(self) -> int | None:
        return self._child.exitcode

    def poll(self) -> int | None:
        return self._child.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._child.join(timeout)
        if self._child.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._child.exitcode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """(stdout, stderr) once it has exited; stderr is "" where both went to `output`."""
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired as err:
            err.output, err.stderr = Path(self._out).read_text(), Path(self._err).read_text()
            raise
        out = Path(self._out).read_text()
        err = "" if self._err == self._out else Path(self._err).read_text()
        shutil.rmtree(self._tmp, ignore_errors=True)
        return out, err

    def kill(self) -> None:
        """SIGKILL to its session (the app, not the ranks: they have sessions of their own)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_app(*args: str, timeout: int = 400, env: dict[str, str] | None = None, cwd: str | Path | None = None,
            ) -> subprocess.CompletedProcess:
    """`python -m rlhf_dyna *args` in `cwd`, forked from the tests' forkserver; its exit code and output."""
    app = AppProcess(*args, env=env, cwd=cwd)
    try:
        out, err = app.communicate(timeout)
    except subprocess.TimeoutExpired:
        app.kill()
        app.wait()
        raise
    return subprocess.CompletedProcess(app.args, app.returncode, out, err)


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
