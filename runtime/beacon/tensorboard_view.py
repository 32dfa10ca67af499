"""TensorBoard as a view of the records: one whole event file per spool flush, never a growing one.

Written with TensorBoard's own protos and record writer rather than `SummaryWriter`, which hands each
scalar to its own thread through a 10-slot queue: ~100 µs a scalar, 1 ms a record of 10 metrics, on
the spool thread. Here a record is one event (each metric a value of its summary), ~40 µs.

Past `points_per_s` records a second the view is thinned evenly, the last record of each flush always
kept: TensorBoard's UI samples 1,000 points a series anyway, and S3's chunks hold every record.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO, TypeVar

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from beacon.contract import Record

SEALED = ".sealed"
T = TypeVar("T")


def event_of(record: Record) -> bytes:
    values = [summary_pb2.Summary.Value(tag=name, simple_value=value) for name, value in record.metrics.items()]
    event = event_pb2.Event(wall_time=record.wall_time, step=record.step, summary=summary_pb2.Summary(value=values))
    return bytes(event.SerializeToString())


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
        self._writer: RecordWriter | None = None
        self._part: Path | None = None

    def write(self, records: Sequence[Record], *, part: int) -> None:
        self.draw(self.within_budget(records), part=part)

    def draw(self, records: Sequence[Record], *, part: int) -> None:
        """Write every one of `records`: those `within_budget` kept."""
        if not records:
            return
        writer = self._writer or self._open(part)
        for record in records:
            writer.write(event_of(record))

    def rotate(self) -> None:
        """Close the open part and seal its file for upload (a whole file, under TensorBoard's name)."""
        if self._file is None or self._part is None:
            return
        self._file.close()
        part, self._file, self._writer, self._part = self._part, None, None, None
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

    def _open(self, part: int) -> RecordWriter:
        self._part = self.directory / f"part-{part:08d}"
        self._part.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.0"
        self._file = open(self._part / name, "wb")  # noqa: SIM115 (closed by rotate)
        self._writer = RecordWriter(self._file)
        self._writer.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        return self._writer

    def within_budget(self, records: Sequence[T]) -> list[T]:
        """Those of `records` (or of what stands for them) the view draws now; the rest are thinned."""
        now = self._clock()
        self._tokens = min(self.points_per_s, self._tokens + (now - self._refilled_at) * self.points_per_s)
        self._refilled_at = now
        kept = thin_evenly(records, int(self._tokens))
        self._tokens = max(0.0, self._tokens - len(kept))  # a kept last record runs up no debt
        self.thinned += len(records) - len(kept)
        return kept
