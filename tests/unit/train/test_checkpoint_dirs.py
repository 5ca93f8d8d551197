"""Which checkpoint a resume takes, and the errors for one that cannot be resumed: naming what is missing and the
complete checkpoints there are; nothing on disk is changed by a refused resume (the app refusing before any rank
spawns: tests/app/train/test_checkpoint_dirs.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlhf_dyna.orchestrator.checkpoint_dirs import CheckpointError, prune, resolve_resume, scan


def make_step(checkpoints: Path, step: int, complete: bool = True, files: tuple[str, ...] = (".metadata",)) -> Path:
    path = checkpoints / f"step_{step}"
    path.mkdir(parents=True)
    for name in files:
        (path / name).write_bytes(b"x")
    if complete:
        (path / "COMPLETE").write_text(json.dumps({"step": step, "files": [".metadata"]}))
    return path


def test_latest_complete_checkpoint_wins_and_leftovers_are_ignored(tmp_path):
    ckpts = tmp_path / "checkpoints"
    make_step(ckpts, 2), make_step(ckpts, 10)
    make_step(ckpts, 12, complete=False)  # killed before the marker
    make_step(ckpts, 11, files=())  # marker, but a listed file is gone
    (ckpts / "step_14.tmp").mkdir()  # killed while writing
    complete, incomplete = scan(ckpts)
    assert [s for s, _ in complete] == [2, 10]  # numeric order, not step_10 < step_2
    assert sorted(p.name for p in incomplete) == ["step_11", "step_12", "step_14.tmp"]
    for given in ("auto", str(tmp_path), str(ckpts)):
        assert resolve_resume(given, tmp_path) == ckpts / "step_10"
    assert resolve_resume(str(ckpts / "step_2"), tmp_path) == ckpts / "step_2"
    assert resolve_resume(None, tmp_path) is None and resolve_resume("auto", tmp_path / "fresh") is None


@pytest.mark.parametrize("target,expected", [
    ("missing", "does not exist"),
    ("checkpoints/step_12", "incomplete checkpoint (missing COMPLETE)"),
    ("checkpoints/step_11", "incomplete checkpoint (missing .metadata)"),
    ("empty", "no complete checkpoint"),
])
def test_unusable_resume_paths_are_refused_with_what_is_missing(tmp_path, target, expected):
    ckpts = tmp_path / "checkpoints"
    make_step(ckpts, 10), make_step(ckpts, 12, complete=False), make_step(ckpts, 11, files=())
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=re.escape(expected)) as err:
        resolve_resume(str(tmp_path / target), tmp_path)
    if "step_1" in target:
        assert str(ckpts / "step_10") in str(err.value)  # the complete ones, to pick instead


def test_prune_keeps_the_newest_complete_ones(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        make_step(ckpts, step)
    make_step(ckpts, 4, complete=False)
    prune(ckpts, keep=2)
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_2", "step_3", "step_4"]  # an incomplete step_N: evidence
