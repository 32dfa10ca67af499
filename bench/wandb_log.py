"""Read what an offline W&B run holds: its `run-<id>.wandb` transaction log, record by record.

The file is a LevelDB-style log (a 7-byte header `:W&B`, 0xBEE1, version 0; then 32 KiB blocks of
records, each a 7-byte header: CRC32, length, type FULL/FIRST/MIDDLE/LAST) of W&B's protobuf
`Record`s, which `wandb sync` uploads. wandb 0.31 has no Python reader of its own.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

HEADER = struct.Struct("<4sHB")
RECORD_HEADER = struct.Struct("<IHB")
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def payloads(data: bytes) -> list[bytes]:
    ident, magic, version = HEADER.unpack_from(data, 0)
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), "not a W&B transaction log"
    found: list[bytes] = []
    offset, pending = HEADER.size, b""
    while offset + RECORD_HEADER.size <= len(data):
        if BLOCK - offset % BLOCK < RECORD_HEADER.size:  # the block's tail is padding
            offset += BLOCK - offset % BLOCK
            continue
        _checksum, length, kind = RECORD_HEADER.unpack_from(data, offset)
        offset += RECORD_HEADER.size
        if kind == 0 and length == 0:  # zero padding up to the next block
            offset += BLOCK - offset % BLOCK if offset % BLOCK else 0
            continue
        chunk = data[offset : offset + length]
        offset += length
        if kind == FULL:
            found.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            found.append(pending + chunk)
            pending = b""
    return found


def _key(item: Any) -> str:
    return str(item.key) if item.key else "/".join(item.nested_key)


@dataclass
class OfflineRun:
    history: list[dict[str, Any]] = field(default_factory=list)  # each row with its "_step"
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    preempting: bool = False


def read_offline_run(path: Path) -> OfflineRun:
    run = OfflineRun()
    for payload in payloads(path.read_bytes()):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {_key(item): json.loads(item.value_json) for item in record.history.item}
            row["_step"] = record.history.step.num if record.history.HasField("step") else row.get("_step")
            run.history.append(row)
        elif kind == "summary":
            run.summary.update({_key(item): json.loads(item.value_json) for item in record.summary.update})
        elif kind == "exit":
            run.exit_code = int(record.exit.exit_code)
        elif kind == "preempting":
            run.preempting = True
    return run
