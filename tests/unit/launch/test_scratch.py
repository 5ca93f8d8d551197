"""A run's node-local files (launch/scratch.py): under the node's temp dir, one directory per process named by its
launch index or its elastic.join name, all removed by the launcher's clean-up whatever its ranks left."""
from __future__ import annotations

import tempfile
from pathlib import Path

from rlhf_dyna.launch.scratch import clean_scratch, process_scratch, scratch_root


def test_one_directory_per_process_under_the_temp_dir_and_the_whole_run_removed(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ident = "rlhfdyna-0123456789ab"
    assert scratch_root(ident) == tmp_path / f"{ident}-snapshots"
    assert process_scratch(ident, 2) == scratch_root(ident) / "rank2"
    assert process_scratch(ident, "request0") == scratch_root(ident) / "request0"
    for process in (0, 2, "request0"):  # rank 2 killed: its file stays until the launcher cleans up
        process_scratch(ident, process).mkdir(parents=True)
        (process_scratch(ident, process) / "actor.0.float32.64").write_bytes(b"x")
    other = process_scratch("rlhfdyna-another", 0)
    other.mkdir(parents=True)
    assert clean_scratch(ident) is True
    assert not scratch_root(ident).exists() and other.is_dir()  # another run's files stay
    assert clean_scratch(ident) is False
