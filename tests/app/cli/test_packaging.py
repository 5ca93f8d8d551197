"""A non-editable install (a built wheel) carries conf/ and the recipe group, and the app finds them."""
from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_wheel_install_runs_help_and_recipes(tmp_path):
    wheel_dir, target = tmp_path / "wheel", tmp_path / "target"
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheel_dir), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(wheel_dir.glob("rlhf_dyna-*.whl"))
    subprocess.run([*pip, "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    # -S skips site (and with it the editable install's finder); dependencies come from site-packages.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *site.getsitepackages()])}
    probe = subprocess.run([sys.executable, "-S", "-c", "import rlhf_dyna; print(rlhf_dyna.__file__)"],
                           env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert probe.stdout.strip().startswith(str(target)), probe.stdout + probe.stderr
    help_text = subprocess.run([sys.executable, "-S", "-m", "rlhf_dyna", "--help"], env=env, capture_output=True,
                               text=True, cwd=tmp_path, timeout=60).stdout
    recipes = sorted(path.stem for path in (REPO / "recipes").glob("*.yaml"))  # every recipe of the checkout
    assert "ppo_tiny" in recipes and f"recipe: {', '.join(recipes)}" in help_text, help_text[-2000:]
    dry = subprocess.run([sys.executable, "-S", "-m", "rlhf_dyna", "recipe=grpo_7b", "dry_run=true",
                          f"hydra.run.dir={tmp_path / 'run'}"], env=env, capture_output=True, text=True, cwd=tmp_path,
                         timeout=300)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert (tmp_path / "run" / "plan_summary.json").is_file()
