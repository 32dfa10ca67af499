"""A rank's evidence, as every reader sees it: the progress document each rank writes (`rank-<r>.json`) and its
one validating parser, the names of a rank's files (document, stacks, the dump at a signal, the flight recorder),
how a stack dump is headed, and which rank a file belongs to.

The writers live in `beacon.evidence.ranks` and `beacon.evidence.flight_recorder`; readers (the doctor, the alarm's
function, the node leaders and rank 0) parse through `RankProgress.from_document` here, so one bad document costs
its rank alone.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields
from typing import Any

from beacon.contract.documents import json_object
from beacon.contract.metrics import Phase
from beacon.contract.pace import RankPace

STALL_DUMP = "no progress for"  # how a stall's stack dump is headed (a SIGTERM's says what it received)
RECEIVED = "received SIG"  # how the Python handler's dump of a signal is headed ("received SIGTERM")
SIGNAL_DUMP = "stacks at the signal, taken in C"
SIGNAL_STACKS_PREFIX = "signal-stacks-rank-"  # how a reader heads faulthandler's own (headerless) dump
# nccl's dump on timeout is TORCH_NCCL_DEBUG_INFO_TEMP_FILE plus the global rank (`keep_flight_recorder`
# sets this prefix): one name for both, so one reader serves both.
FLIGHT_RECORDER_PREFIX = "flight-recorder-rank-"
FLIGHT_RECORDER_ENTRIES = 2000  # collectives kept per rank (about 350 bytes each in a dump)


def flight_recorder_name(rank: int) -> str:
    return f"{FLIGHT_RECORDER_PREFIX}{rank}"


def rank_document_name(rank: int) -> str:
    return f"rank-{rank:05d}.json"


def stacks_name(rank: int) -> str:
    return f"stacks-rank-{rank:05d}.txt"


def signal_stacks_name(rank: int) -> str:
    return f"{SIGNAL_STACKS_PREFIX}{rank:05d}.txt"


def signal_dump_header(rank: int, pid: int) -> str:
    """The head of a process's `signal-stacks-rank-<r>.txt`, written at registration (faulthandler writes none)."""
    return f"--- rank {rank} pid {pid}: {SIGNAL_DUMP}\n"


def took_signal(signal_dump: str) -> bool:
    """Whether a signal stacks file holds a dump, not only its head."""
    return any(line.startswith(("Current thread 0x", "Thread 0x")) for line in signal_dump.splitlines())


def with_signal_dump(stacks: str, signal_dump: str) -> str:
    """A rank's stacks file with its process's dump at the signal (`RankSignal.dump_at_signal`) as the last section;
    unless no signal came, or the same process's Python handler dumped it too (its main thread was free: that
    section has the step). Sections of other processes (an earlier attempt's, appended above) do not count."""
    head = signal_dump.split("\n", 1)[0]
    if not took_signal(signal_dump) or not head.startswith("--- rank "):
        return stacks
    pid = head.split(" pid ", 1)[1].split(":", 1)[0] if " pid " in head else "?"
    if any(
        line.startswith("--- rank ") and f" pid {pid} " in line and f": {RECEIVED}" in line
        for line in stacks.splitlines()
    ):
        return stacks
    return f"{stacks.rstrip()}\n{signal_dump}".lstrip("\n")


@dataclass(frozen=True)
class RankProgress:
    """One rank's last word: what `rank-<r>.json` holds."""

    rank: int
    local_rank: int
    world_size: int
    step: int  # the last step the host dispatched (-1 before the first)
    phase: str
    progress_age: float  # seconds since the last step, phases excluded
    wall_time: float  # when this document was written
    last_step_wall_time: float  # when the last step was dispatched, as wall time
    pid: int
    pod: str
    node: str
    instance: str
    stacks_dumped: int  # dumps so far
    # How this rank ended (`finished`, `failed: RuntimeError`, `preempted`), written by its last word;
    # empty while it runs, and forever if it was killed outright: its silence is then the sign.
    ended: str = ""
    node_rank: int = -1  # torchrun's GROUP_RANK: which node's leader uploads this rank's files (-1: unknown)
    phase_seconds: float = 0.0  # how long it has been in its own phase when written (0 while training)
    phase_limit: float = 0.0  # its RunSettings.phase_limit (0: an older document, its phases unbounded)
    # Its pace over its last steps (`contract.pace.RankPace`; 0 steps: an older document, or none yet). JSON has
    # no NaN: a wait it did not time (no `run.watch`) is -1.
    pace_steps: int = 0
    pace_window_s: float = 0.0
    pace_step_s: float = 0.0
    pace_wait_s: float = -1.0
    # The stall threshold its pace gives (`contract.pace.stall_threshold_for`): the run's is the longest its ranks
    # state (`contract.pace.run_stall_after`); 0 before a baseline (setup, warm-up) or in an older document.
    stall_after_s: float = 0.0

    @property
    def pace(self) -> RankPace:
        wait = self.pace_wait_s if self.pace_wait_s >= 0 else math.nan
        step = self.pace_step_s if self.pace_steps else math.nan
        return RankPace(rank=self.rank, steps=self.pace_steps, window_s=self.pace_window_s, step_s=step, wait_s=wait)

    def working_in_phase(self, now: float) -> bool:
        """In a named phase still within its limit at `now`: working (a 150 s checkpoint), not hung; past it,
        a rank that never left its checkpoint or evaluation reads as stopped there."""
        if self.phase == Phase.TRAINING:
            return False
        return (
            self.phase == Phase.SETUP
            or not self.phase_limit
            or self.phase_seconds + max(0.0, now - self.wall_time) < self.phase_limit
        )

    @classmethod
    def from_document(cls, body: bytes) -> RankProgress:
        """A document of this or another Beacon version: fields it does not know are left out (a function deployed
        from older code still reads a newer job's documents). ValueError, naming the field, when it is not one: not
        a JSON object, a field missing, or of another type (`"rank": "1"`). The one parser every reader uses."""
        document = json_object(body)
        values: dict[str, Any] = {}
        for spec in fields(cls):
            if spec.name not in document:
                if spec.default is MISSING:
                    raise ValueError(f"no field {spec.name!r}")
                continue
            value, kind = document[spec.name], _DOCUMENT_TYPES[str(spec.type)]
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ValueError(f"{spec.name}: {value!r} is not {spec.type}")
            values[spec.name] = float(value) if isinstance(value, int | float) and spec.type == "float" else value
        return cls(**values)


_DOCUMENT_TYPES: dict[str, type | tuple[type, ...]] = {"int": int, "float": (int, float), "str": str}

# The ranks of an attempt start together (torchrun restarts its workers together, and a rank that dies takes
# the others' collectives with it): a document written this long before a reader's own start is an earlier
# attempt's. A restore brings such documents back (a rerun on SageMaker restores every node's files on every
# node), and a rank of the earlier attempt that is gone (a smaller world) leaves its own behind.
EARLIER_ATTEMPT_SLACK_S = 60.0


def rank_of_file(name: str) -> int | None:
    """The rank a file of the ranks directory belongs to (its document, stacks or flight recorder)."""
    for prefix, suffix in (
        ("rank-", ".json"),
        ("stacks-rank-", ".txt"),
        (SIGNAL_STACKS_PREFIX, ".txt"),
        (FLIGHT_RECORDER_PREFIX, ""),
    ):
        number = name.removeprefix(prefix).removesuffix(suffix) if name.startswith(prefix) else ""
        if number.isdigit() and name.endswith(suffix):
            return int(number)
    return None
