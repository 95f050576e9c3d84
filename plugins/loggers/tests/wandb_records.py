"""Reads the history rows of an offline wandb run file (``run-<id>.wandb``).

wandb 0.31 has no Python reader of its own (the Go core writes the file). The file is a ``:W&B``
header followed by a LevelDB-style log: 32 KiB blocks of records (4-byte checksum, 2-byte
little-endian length, 1-byte type: full, first, middle, last), each payload a ``Record`` protobuf.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7  # ":W&B", the 2-byte magic, the version byte
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def payloads(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    out, pending, pos = [], b"", HEADER
    while pos + 7 <= len(data):
        room = BLOCK - pos % BLOCK
        if room < 7:  # the block's tail is padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0:  # zeroed space after the last record
            break
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            out.append(pending)
    return out


def history(path: Path) -> list[dict[str, Any]]:
    """The logged rows, each with ``_step``, in file order."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for payload in payloads(path):
        record = pb.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows
