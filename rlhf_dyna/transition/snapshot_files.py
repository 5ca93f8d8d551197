"""The snapshots' own copies as files on node-local disk, mapped into memory (transition/replica_state.py).

Each role's own copy is written straight into one of two slot files per dtype, the one that does not hold the committed
snapshot, so a snapshot in progress never touches the one a recovery falls back to; the files stay mapped from one
snapshot to the next (no new pages, no file made or removed per snapshot: the page cache keeps them, the kernel writes
them back). A replica holder that sees the same directory (the same machine and filesystem: `PeerDir.same_files`)
copies its predecessor's slot from the page cache instead of receiving it over the network, as NCCL's shared-memory
transport does between ranks of one node; a holder on another node receives it over gloo.

    files = SnapshotFiles(directory)
    own = files.own("actor", slot, sizes)                 # dtype -> a tensor mapped on <dir>/actor.<slot>.<dtype>.<n>
    theirs = files.peer(peer.directory, "actor", slot, sizes)   # the predecessor's slot, mapped for reading
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from .views import TORCH_DTYPES


def file_name(role: str, slot: int, dtype: str, numel: int) -> str:
    """A slot file's name: a new size is a new file, so a holder never reads a file remapped to another size."""
    return f"{role}.{slot}.{dtype}.{numel}"


@dataclass(frozen=True)
class PeerDir:
    """Where a rank's snapshot files are, and which filesystem holds them (its boot id, device and inode)."""

    directory: Path
    filesystem: str

    @classmethod
    def of(cls, directory: Path) -> PeerDir:
        directory.mkdir(parents=True, exist_ok=True)
        root = directory.parent.stat()
        try:
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:  # no boot id: this process alone, so every peer is reached over the network
            boot = f"pid{os.getpid()}"
        return cls(directory, f"{boot}:{root.st_dev}:{root.st_ino}")

    def same_files(self, other: PeerDir) -> bool:
        """Whether `other`'s files are this rank's to read: the same machine, filesystem and scratch root."""
        return self.filesystem == other.filesystem


class SnapshotFiles:
    """This rank's own slot files and its predecessor's, each mapped once and kept mapped while its file stays."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._maps: dict[Path, tuple[tuple[int, int], Tensor]] = {}  # path -> ((device, inode), its mapping)
        self._kept: tuple[set[str], set[str]] | None = None  # the names the last keep_only kept

    def own(self, role: str, slot: int, sizes: dict[str, int]) -> dict[str, Tensor]:
        """`role`'s slot `slot`: one tensor per dtype of `sizes` (dtype -> elements), mapped shared on its file (made
        the first time)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        return {dtype: self._map(self.directory / file_name(role, slot, dtype, n), n, dtype, create=True)
                for dtype, n in sizes.items()}

    def peer(self, directory: Path, role: str, slot: int, sizes: dict[str, int]) -> dict[str, Tensor]:
        """The predecessor's slot `slot` of `role` in `directory`, mapped to read (it wrote the slot before saying so)."""
        return {dtype: self._map(directory / file_name(role, slot, dtype, n), n, dtype, create=False)
                for dtype, n in sizes.items()}

    def _map(self, path: Path, numel: int, dtype: str, create: bool) -> Tensor:
        torch_dtype = TORCH_DTYPES[dtype]
        if create and path in self._maps:  # an own file: only this process makes or removes it
            return self._maps[path][1]
        try:
            stat = path.stat()
        except FileNotFoundError:
            if not create:
                raise FileNotFoundError(f"the replica's source file {path} is missing: its rank removed it or lost "
                                        f"its scratch directory") from None
            stat = None
        known = self._maps.get(path)
        if stat is not None and known is not None and known[0] == (stat.st_dev, stat.st_ino):
            return known[1]
        if stat is not None and not create and stat.st_size != numel * torch_dtype.itemsize:
            raise ValueError(f"the replica's source file {path} holds {stat.st_size} bytes, not "
                             f"{numel * torch_dtype.itemsize}: its rank's layout is not this snapshot's")
        mapped = torch.from_file(str(path), shared=True, size=numel, dtype=torch_dtype)
        stat = path.stat()
        self._maps[path] = ((stat.st_dev, stat.st_ino), mapped)
        return mapped

    def keep_only(self, own: dict[str, dict[str, int]], peer: dict[str, dict[str, int]]) -> None:
        """Only the files of the committed snapshot's sizes (role -> dtype -> elements) kept, both slots of each: own
        files of other sizes (a layout before a relayout) removed, and the mappings of any other file dropped."""
        mine, theirs = _names(own), _names(peer)
        if (mine, theirs) == self._kept:
            return
        self._kept = (mine, theirs)
        self._maps = {p: m for p, m in self._maps.items() if p.name in (mine if p.parent == self.directory else theirs)}
        for path in self.directory.iterdir() if self.directory.exists() else ():
            if path.name not in mine:
                path.unlink(missing_ok=True)

    def disk_bytes(self) -> int:
        """The bytes of this rank's own slot files (every one is mapped)."""
        return sum(m.nbytes for p, (_, m) in self._maps.items() if p.parent == self.directory)

    def forget_peers(self) -> None:
        """The predecessor's mappings dropped (a new ring: another predecessor, or its files gone)."""
        self._maps = {p: m for p, m in self._maps.items() if p.parent == self.directory}
        self._kept = None

    def remove(self) -> None:
        """The end of the run: every mapping dropped and this rank's directory removed."""
        self._maps.clear()
        shutil.rmtree(self.directory, ignore_errors=True)


def _names(sizes: dict[str, dict[str, int]]) -> set[str]:
    return {file_name(role, slot, dtype, n) for role, by_dtype in sizes.items() for dtype, n in by_dtype.items()
            for slot in (0, 1)}
