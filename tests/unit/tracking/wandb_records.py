"""Reads an offline wandb run file (run-*.wandb) back into protobuf records, so tests can check
what wandb actually stored. Format: 7-byte ":W&B" header, then LevelDB-log records in 32 KiB
blocks, each with a 7-byte (crc32, length, type) header; types 1 full, 2 first, 3 middle, 4 last."""
from __future__ import annotations

import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2 as pb

BLOCK_SIZE = 32 * 1024
HEADER = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> list[pb.Record]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a wandb transaction log"
    pos, pending, payloads = 7, b"", []
    while pos + HEADER.size <= len(data):
        left_in_block = BLOCK_SIZE - pos % BLOCK_SIZE
        if left_in_block < HEADER.size:  # block trailer padding
            pos += left_in_block
            continue
        _, length, kind = HEADER.unpack_from(data, pos)
        chunk = data[pos + HEADER.size : pos + HEADER.size + length]
        pos += HEADER.size + length
        if kind == FULL:
            payloads.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            payloads.append(pending + chunk)
    records = []
    for payload in payloads:
        record = pb.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


def history_rows(records: list[pb.Record]) -> list[dict[str, str]]:
    """History rows as {key: value_json}, in logging order."""
    return [
        {item.key or "/".join(item.nested_key): item.value_json for item in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
