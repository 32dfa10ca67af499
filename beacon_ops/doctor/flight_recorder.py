"""The first collective the ranks did not all join, read from their flight-recorder dumps
(`beacon.evidence.flight_recorder`, or nccl's own on a timeout) by PyTorch's own analyser,
`torch.distributed.flight_recorder` (what `torchfrtrace` runs), not by a parser of Beacon's.

The one place the operator imports torch, and only when there are dumps to read: the alarm's function
has no torch, and then says where the dumps are and that `beacon doctor` with torch reads them.
"""

from __future__ import annotations

import gc
import io
import logging
import pickle
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from beacon.contract.rank_evidence import FLIGHT_RECORDER_PREFIX

from beacon_ops.doctor.rank_verdict import rank_list

NO_TORCH = "PyTorch is not installed here: `beacon doctor` with torch installed reads them"
ANALYSER_LOGGER = "Flight Recorder"  # torch's analyser prints every mismatch through it


@dataclass(frozen=True)
class Mismatch:
    """The first collective of a process group that its ranks did not all issue alike."""

    operation: str  # as the recorder names it: `gloo:all_reduce`, `nccl:all_reduce`, ...
    sequence_id: int  # its number in its process group (collectives and point-to-point counted apart)
    group: str  # `0:default_pg`
    joined: list[int]
    missing: list[int]  # ranks that never issued it
    differing: dict[int, str] = field(default_factory=dict)  # rank -> what it issued instead, in torch's words

    def line(self) -> str:
        text = f"first mismatched collective: {self.operation} #{self.sequence_id} in process group {self.group}"
        if self.joined:
            text += f", joined by rank(s) {rank_list(self.joined)}"
        if self.missing:
            text += f"; rank(s) {rank_list(self.missing)} did not join"
        for rank, what in sorted(self.differing.items()):
            text += f"; rank {rank} issued {what}"
        return text


@dataclass(frozen=True)
class FlightRecorderReading:
    keys: list[str]  # where the dumps are, in rank order
    mismatch: Mismatch | None = None
    unread: str = ""  # why they were not analysed, when they were not
    world_size: int = 0  # the ranks there are (0: not known), so a rank without a dump is named

    def line(self) -> str:
        ranks = rank_list(ranks_of(self.keys))
        if self.unread:
            return f"flight-recorder dumps of rank(s) {ranks} at {_where(self.keys)}: {self.unread}"
        absent = sorted(set(range(self.world_size)) - set(ranks_of(self.keys)))
        if self.mismatch is None and absent:
            # A frozen or dead rank writes no dump: the others agree among themselves, which says nothing of it
            return f"flight recorder: no dump from rank(s) {rank_list(absent)}; rank(s) {ranks} agree among themselves"
        if self.mismatch is None:
            return f"flight recorder of rank(s) {ranks}: no mismatched collective"
        return self.mismatch.line()


def ranks_of(keys: list[str]) -> list[int]:
    return [int(key.rsplit(FLIGHT_RECORDER_PREFIX, 1)[1]) for key in keys]


def _where(keys: list[str]) -> str:
    folder = keys[0].rsplit(FLIGHT_RECORDER_PREFIX, 1)[0]
    return keys[0] if len(keys) == 1 else f"{folder}{FLIGHT_RECORDER_PREFIX}<rank>"


def read_flight_recorder(dumps: dict[str, bytes], *, world_size: int = 0) -> FlightRecorderReading | None:
    """The first mismatched collective in `dumps` (key -> a rank's dump, its file name
    `flight-recorder-rank-<r>` last); None without dumps. Never raises: what it cannot read, it says."""
    if not dumps:
        return None
    keys = sorted(dumps, key=lambda key: ranks_of([key])[0])
    try:
        analyser = _analyser()
    except ImportError:
        return FlightRecorderReading(keys, unread=NO_TORCH, world_size=world_size)
    try:
        return FlightRecorderReading(keys, mismatch=_first_mismatch(analyser, dumps), world_size=world_size)
    except (Exception, SystemExit) as error:  # the analyser asserts, and exits on what it cannot parse
        why = f"{type(error).__name__}: {error}"
        return FlightRecorderReading(keys, unread=f"PyTorch's analyser cannot read them: {why}", world_size=world_size)


def ranks_in_a_collective(dumps: dict[str, bytes]) -> set[int]:
    """The ranks whose own dump holds a collective they issued that has not completed (a process group whose last
    enqueued collective is past its last completed one): inside backward, DDP's reducer's bucket all_reduce, which
    it issues from C++ hooks. Read as plain data, without torch (the alarm's function has none); a dump that is not
    one says nothing."""
    found = set()
    for key, body in dumps.items():
        try:
            dump = _DataOnly(io.BytesIO(body)).load()
            groups = dump.get("pg_status", {}).values() if isinstance(dump, dict) else ()
            if any(_count(g, "last_enqueued_collective") > _count(g, "last_completed_collective") for g in groups):
                found.add(ranks_of([key])[0])
        except Exception:  # torn, forged or of another version: it shows no collective
            continue
    return found


def _count(group: object, name: str) -> int:
    value = group.get(name, -1) if isinstance(group, dict) else -1
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _analyser() -> Any:
    # Its builder warns at import when `tabulate` is missing; nothing of it is for the doctor's reader.
    logging.getLogger(ANALYSER_LOGGER).disabled = True
    from torch.distributed.flight_recorder.components import builder, config_manager, loader

    return builder, config_manager, loader


class _DataOnly(pickle.Unpickler):
    """A dump is plain data; one that names a class could run code when unpickled: refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a flight-recorder dump holds only plain data, not {module}.{name}")


def _first_mismatch(analyser: Any, dumps: dict[str, bytes]) -> Mismatch | None:
    builder, config_manager, loader = analyser
    gc_enabled = gc.isenabled()
    with tempfile.TemporaryDirectory(prefix="beacon-flight-recorder-") as folder:
        for key, body in dumps.items():
            _DataOnly(io.BytesIO(body)).load()  # before torch's loader unpickles it
            (Path(folder) / key.rsplit("/", 1)[-1]).write_bytes(body)
        # torch's own command line: a dead rank leaves no dump, and the others still say what it missed
        args = config_manager.JobConfig().parse_args(
            [folder, "--prefix", FLIGHT_RECORDER_PREFIX, "--allow-incomplete-ranks"]
        )
        try:
            details, version = loader.read_dir(args)
            database = builder.build_db(details, args, version)
        finally:
            if gc_enabled:
                gc.enable()  # its loader turns the collector off for good
    for collective in database.collectives:
        if collective.pass_check and not collective.missing_ranks:
            continue
        differing = {
            rank: f"{other.collective_name} #{other.collective_seq_id} ({other.type_of_mismatch})"
            for rank, other in (collective.mismatch_collectives or {}).items()
        }
        missing = set(collective.missing_ranks or ())
        return Mismatch(
            operation=collective.collective_name,
            # point-to-point operations are numbered apart, and have no collective number
            sequence_id=collective.collective_seq_id or collective.p2p_seq_id,
            group=collective.pg_desc,
            joined=sorted(set(collective.expected_ranks) - missing - set(differing)),
            missing=sorted(missing),
            differing=differing,
        )
    return None
