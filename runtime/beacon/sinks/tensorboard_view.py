"""TensorBoard as a view of the records: one whole event file per spool flush, never a growing one.

Not `SummaryWriter`, which hands each scalar to its own thread through a 10-slot queue: ~100 µs a
scalar, 1 ms a record of 10 metrics, on the spool thread. Here a record is one event (each metric a
value of its summary), encoded and framed here, byte for byte what TensorBoard's own `Event` proto and
`RecordWriter` write (the tests compare): ~18 µs, where building the protos and TensorBoard's per-byte
CRC-32C took ~40 µs, the largest share of the spool thread's time at 1,000 points a second.

Past `points_per_s` records a second the view is thinned evenly, the last record of each flush always
kept: TensorBoard's UI samples 1,000 points a series anyway, and S3's chunks hold every record.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO, TypeVar

from tensorboard.compat.proto import event_pb2

from beacon.contract import Record

SEALED = ".sealed"
T = TypeVar("T")
_DOUBLE, _FLOAT, _LENGTH, _CRC = struct.Struct("<d"), struct.Struct("<f"), struct.Struct("<Q"), struct.Struct("<I")
_ZERO_DOUBLE = bytes(8)


def _varint(value: int) -> bytes:
    value &= 0xFFFF_FFFF_FFFF_FFFF  # an int64 as protobuf writes it: a negative one in ten bytes
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_VALUE_HEADS: dict[str, bytes] = {}  # per metric name: the summary's value field up to its float


def _value_head(name: str) -> bytes:
    head = _VALUE_HEADS.get(name)
    if head is None:
        raw = name.encode()
        tag = b"\x0a" + _varint(len(raw)) + raw if raw else b""  # Value.tag (1); proto3 omits ""
        # Summary.value (1), of Value.tag and Value.simple_value (2, a float32: 4 bytes and its key)
        head = _VALUE_HEADS[name] = b"\x0a" + _varint(len(tag) + 5) + tag + b"\x15"
    return head


def _float32(value: float) -> bytes:
    try:
        return _FLOAT.pack(value)
    except OverflowError:  # beyond float32: infinity, as the proto's own conversion makes it
        return _FLOAT.pack(math.copysign(math.inf, value))


def event_of(record: Record) -> bytes:
    """The record as a serialized `Event` (wall_time, step, a summary of one simple value a metric)."""
    summary = b"".join([_value_head(name) + _float32(value) for name, value in record.metrics.items()])
    wall_time = _DOUBLE.pack(record.wall_time)
    return b"".join(
        (
            b"\x09" + wall_time if wall_time != _ZERO_DOUBLE else b"",  # Event.wall_time (1); proto3 omits 0
            b"\x10" + _varint(record.step) if record.step else b"",  # Event.step (2)
            b"\x2a" + _varint(len(summary)),  # Event.summary (5), in a oneof: always written
            summary,
        )
    )


def _crc_tables() -> tuple[list[int], ...]:
    """CRC-32C (Castagnoli, reflected) tables for eight bytes at a time ("slicing by 8")."""
    first = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        first.append(crc)
    tables = [first]
    for _ in range(7):
        tables.append([(crc >> 8) ^ first[crc & 0xFF] for crc in tables[-1]])
    return tuple(tables)


_T0, _T1, _T2, _T3, _T4, _T5, _T6, _T7 = _crc_tables()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    whole = len(data) - len(data) % 8
    for (word,) in struct.iter_unpack("<Q", data[:whole]):
        word ^= crc
        crc = (
            _T7[word & 0xFF] ^ _T6[word >> 8 & 0xFF] ^ _T5[word >> 16 & 0xFF] ^ _T4[word >> 24 & 0xFF]
            ^ _T3[word >> 32 & 0xFF] ^ _T2[word >> 40 & 0xFF] ^ _T1[word >> 48 & 0xFF] ^ _T0[word >> 56]
        )  # fmt: skip
    for byte in data[whole:]:
        crc = _T0[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> bytes:
    crc = crc32c(data)
    return _CRC.pack((((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def framed(data: bytes) -> bytes:
    """`data` as one TFRecord: its length, that length's masked CRC-32C, the data, the data's."""
    length = _LENGTH.pack(len(data))
    return length + _masked_crc(length) + data + _masked_crc(data)


def thin_evenly(records: Sequence[T], keep: int) -> list[T]:
    """`keep` records spread evenly over `records`, the last one always among them."""
    if keep >= len(records):
        return list(records)
    stride = len(records) / max(1, keep)
    return [records[len(records) - 1 - int(i * stride)] for i in range(max(1, keep))][::-1]


class TensorBoardView:
    """The open part (a directory per flush, as TensorBoard names files) and the sealed files to upload."""

    def __init__(self, directory: Path, *, points_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self.points_per_s = points_per_s
        self.thinned = 0  # records left out of the view (never out of S3)
        self._clock = clock
        self._tokens = points_per_s  # one second's worth at start
        self._refilled_at = clock()
        self._file: BinaryIO | None = None
        self._part: Path | None = None

    def write(self, records: Sequence[Record], *, part: int) -> None:
        self.draw(self.within_budget(records), part=part)

    def draw(self, records: Sequence[Record], *, part: int) -> None:
        """Write every one of `records`: those `within_budget` kept."""
        if not records:
            return
        events = self._file or self._open(part)
        events.write(b"".join([framed(event_of(record)) for record in records]))

    def rotate(self) -> None:
        """Close the open part and seal its file for upload (a whole file, under TensorBoard's name)."""
        if self._file is None or self._part is None:
            return
        self._file.close()
        part, self._file, self._part = self._part, None, None
        self.seal_part(part)

    def seal_part(self, part: Path) -> None:
        for event_file in part.glob("events.out.tfevents.*"):
            event_file.rename(self.directory / f"{part.name}.{event_file.name}{SEALED}")
        part.rmdir()

    def seal_leftovers(self) -> None:
        """A part a crash left open is sealed and uploaded like any other: its points happened."""
        for part in sorted(self.directory.glob("part-*")):
            if part.is_dir():
                self.seal_part(part)

    def sealed(self) -> list[Path]:
        return sorted(self.directory.glob(f"*{SEALED}"))

    def _open(self, part: int) -> BinaryIO:
        self._part = self.directory / f"part-{part:08d}"
        self._part.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.0"
        self._file = open(self._part / name, "wb")  # noqa: SIM115 (closed by rotate)
        self._file.write(
            framed(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        )
        return self._file

    def within_budget(self, records: Sequence[T]) -> list[T]:
        """Those of `records` (or of what stands for them) the view draws now; the rest are thinned."""
        now = self._clock()
        self._tokens = min(self.points_per_s, self._tokens + (now - self._refilled_at) * self.points_per_s)
        self._refilled_at = now
        kept = thin_evenly(records, int(self._tokens))
        self._tokens = max(0.0, self._tokens - len(kept))  # a kept last record runs up no debt
        self.thinned += len(records) - len(kept)
        return kept
