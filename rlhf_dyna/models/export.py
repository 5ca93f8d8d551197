"""Export of the trained policy as an HF directory that `transformers` and vLLM open.

Tensors arrive one at a time (gathered from their shards by the caller, e.g. `train.engine.full_state_dict`)
and are written in safetensors files of bounded size with an index json, so rank 0 never holds the whole
model. The directory appears atomically: it is written as `<dir>.tmp` and renamed."""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

from safetensors.torch import save_file
from torch import Tensor

INDEX_FILE = "model.safetensors.index.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")  # weights of the source dir, never copied


class ShardWriter:
    """Buffers tensors and flushes a `model-XXXXX.safetensors` file whenever the next would pass max_bytes."""

    def __init__(self, out: Path, max_bytes: int) -> None:
        self.out, self.max_bytes = out, max_bytes
        self.pending: dict[str, Tensor] = {}
        self.pending_bytes = 0
        self.files: list[tuple[str, list[str]]] = []  # (file name, tensor names) in write order
        self.total_bytes = 0

    def add(self, name: str, tensor: Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.max_bytes:
            self.flush()
        self.pending[name] = tensor.detach().to("cpu").contiguous()
        self.pending_bytes += size
        self.total_bytes += size

    def flush(self) -> None:
        if not self.pending:
            return
        file = f"model-{len(self.files) + 1:05d}.safetensors"  # renamed to -of-N once N is known
        save_file(self.pending, str(self.out / file), metadata={"format": "pt"})
        self.files.append((file, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def finish(self) -> None:
        """HF's naming (model-00001-of-00003.safetensors) plus the index that maps every tensor to its file."""
        self.flush()
        total = len(self.files)
        weight_map = {}
        for i, (file, names) in enumerate(self.files, start=1):
            final = f"model-{i:05d}-of-{total:05d}.safetensors"
            (self.out / file).rename(self.out / final)
            weight_map.update({name: final for name in names})
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        (self.out / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True))


def copy_model_files(source_dir: Path, out: Path) -> None:
    """config.json, generation_config.json, tokenizer files, chat template: everything of the source dir but weights."""
    for path in sorted(source_dir.iterdir()):
        if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES) and not path.name.endswith(".index.json"):
            shutil.copy2(path, out / path.name)


def export_hf_dir(weights: Iterable[tuple[str, Tensor]], source_dir: Path, out_dir: Path, max_shard_bytes: int,
                  tied_embeddings: bool, write: bool, tokenizer=None, config=None) -> Path:
    """Consumes `weights` on every rank (gathers are collective); only where `write` are files written.

    The source dir (the run's model dir: config.json, tokenizer, ...) supplies every file but the weights;
    a tokenizer with `save(dir)` is written over them, so the export carries the tokenizer the run used, and a
    `config` (an HF config) over config.json, for a model of another class than the source's (a reward model)."""
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    writer = None
    if write:
        shutil.rmtree(tmp, ignore_errors=True)  # the leftover of a run killed while exporting
        tmp.mkdir(parents=True)
        writer = ShardWriter(tmp, max_shard_bytes)
    for name, tensor in weights:
        if writer is not None and not (tied_embeddings and name == "lm_head.weight"):  # HF and vLLM re-tie on load
            writer.add(name, tensor)
    if writer is None:
        return out_dir
    writer.finish()
    copy_model_files(source_dir, tmp)
    if tokenizer is not None and hasattr(tokenizer, "save"):
        tokenizer.save(tmp)
    if config is not None:
        config.save_pretrained(tmp)
    old = out_dir.with_name(out_dir.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out_dir.exists():
        out_dir.rename(old)  # two renames: a crash between them leaves policy.old complete
    tmp.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)
    return out_dir
