"""A run's node-local files: the snapshots' own copies (elastic.replicas=1, transition/snapshot_files.py) under the
node's temp dir, named after the run and the process, and removed when the run ends (as its /dev/shm segments are).

Not the run directory: that may be on a network filesystem, and these files are written every snapshot and read back
by the process that wrote them (a survivor rolling back to the snapshot) and by its replica holder on the same node."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path


def scratch_root(run_ident: str) -> Path:
    """The run's directory under the node's temp dir (`<tmp>/<ident>-snapshots`)."""
    return Path(tempfile.gettempdir()) / f"{run_ident}-snapshots"


def process_scratch(run_ident: str, process: int | str) -> Path:
    """One process's directory: `rank<r>` for a launched process r (its launch index, kept through renumbering),
    the process's name for an `elastic.join` one (e.g. `request0`)."""
    return scratch_root(run_ident) / (f"rank{process}" if isinstance(process, int) else str(process))


def clean_scratch(run_ident: str) -> bool:
    """Remove the run's directory and everything in it (a killed rank's files too); whether there was one."""
    root = scratch_root(run_ident)
    existed = root.exists()
    shutil.rmtree(root, ignore_errors=True)
    return existed
