"""A run's records and the documents around them: the record line, its history, the index's chunk summaries,
hyperparameters, the final state and the progress log line."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from beacon.contract.documents import NUMBER, checked_object
from beacon.contract.layout import INDEX_GROUP

try:  # the spool's fast line writer; readers need none (the alarm's function bundles this file with boto3 alone)
    import orjson as _orjson
except ImportError:
    _orjson = None  # type: ignore[assignment]

# --- Records ------------------------------------------------------------------------------
# JSON has no NaN or infinity; a strict reader (jq, a browser, Athena) refuses Python's bare `NaN`.
# Non-finite values are therefore written as these strings and read back as the floats they were.
_NON_FINITE_TEXT = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


# The slow path of a line (non-finite values, what orjson refuses): `json.dumps` with separators
# builds a new encoder per call.
_LINE_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _encode_value(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _decode_value(value: float | int | str) -> float:
    if isinstance(value, str):
        if value not in _NON_FINITE_TEXT:
            raise ValueError(f"metric value {value!r} is neither a number nor NaN/Infinity/-Infinity")
        return _NON_FINITE_TEXT[value]
    return float(value)


@dataclass(frozen=True, init=False)
class Record:
    """One logged step: every metric of it, faithful (NaN stays NaN). The unit of the spool, of an
    event chunk in S3, and of every reader; `seq` is the spool's gapless sequence number."""

    experiment: str
    run: str
    step: int
    metrics: dict[str, float]
    wall_time: float
    seq: int = -1
    rank: int = 0  # the rank that wrote it: only rank 0 writes
    # The run's attempt that went through this step: 0, then one more at each restart. A restart that
    # resumes from a checkpoint goes through some steps again; see `history`.
    attempt: int = 0

    def __init__(
        self,
        experiment: str,
        run: str,
        step: int,
        metrics: dict[str, float],
        wall_time: float,
        seq: int = -1,
        rank: int = 0,
        attempt: int = 0,
    ) -> None:
        # One write rather than a frozen dataclass's eight: the spool thread makes one per record.
        object.__setattr__(
            self,
            "__dict__",
            {
                "experiment": experiment,
                "run": run,
                "step": step,
                "metrics": metrics,
                "wall_time": wall_time,
                "seq": seq,
                "rank": rank,
                "attempt": attempt,
            },
        )

    @property
    def loss(self) -> float | None:
        return self.metrics.get(LOSS_KEY)

    def to_line(self, seq: int | None = None) -> bytes:
        """The record as one JSON line; `seq` numbers it without a copy (the spool's hot path).

        orjson writes it, ~15x faster than `json`, whose `float.__repr__` took most of the spool thread's
        time. Its text may differ from `json`'s (`0.00001` for `1e-05`, UTF-8 for `\\u` escapes), never
        its values: `from_line`, and any JSON reader, reads both alike."""
        body = {
            "experiment": self.experiment,
            "run": self.run,
            "rank": self.rank,
            "attempt": self.attempt,
            "step": self.step,
            "seq": self.seq if seq is None else seq,
            "wall_time": self.wall_time,
            "metrics": self.metrics,
        }
        if _orjson is not None:
            # orjson writes NaN and infinity as null: any non-finite value makes this sum non-finite (so
            # does an overflow, which only costs the `json` path).
            try:
                if math.isfinite(sum(self.metrics.values(), self.wall_time)):
                    return _orjson.dumps(body, option=_orjson.OPT_APPEND_NEWLINE)
            except Exception:  # not numbers (a text, a tensor), what orjson refuses (an int beyond 64 bits)
                pass  # `json` decides
        try:
            return _LINE_ENCODER.encode(body).encode() + b"\n"
        except ValueError:  # a non-finite value: written as its name (see _NON_FINITE_TEXT)
            body["metrics"] = {name: _encode_value(value) for name, value in self.metrics.items()}
            return _LINE_ENCODER.encode(body).encode() + b"\n"

    @classmethod
    def from_line(cls, line: bytes | str) -> Record:
        body = json.loads(line)
        return cls(
            experiment=str(body["experiment"]),
            run=str(body["run"]),
            step=int(body["step"]),
            metrics={str(name): _decode_value(value) for name, value in body["metrics"].items()},
            wall_time=float(body["wall_time"]),
            seq=int(body["seq"]),
            rank=int(body.get("rank", 0)),
            attempt=int(body.get("attempt", 0)),
        )


@dataclass(frozen=True)
class History:
    """A run's records as the model went through them. Several `run.log` calls for one step are one
    step: their metrics merge, in sequence order, into one live record (an evaluation logged at the
    step it ran after belongs to that step). When attempt k resumes from a checkpoint and first logs
    step N, the records of earlier attempts from step N on describe a past the model no longer has:
    they are superseded (kept in S3, marked here, never deleted)."""

    live: list[Record]  # one per step, in step order, its metrics merged from every call for the step
    superseded: list[Record]
    duplicated: list[Record]  # logged a metric its (attempt, step) already had: a second writer

    @property
    def live_steps(self) -> list[int]:
        return [record.step for record in self.live]

    @property
    def attempts(self) -> list[int]:
        return sorted({record.attempt for record in (*self.live, *self.superseded)})


def history(records: Iterable[Record]) -> History:
    """Sort `records` into the live history, the superseded records and the duplicates. The records of
    one (attempt, step) merge in sequence order; one that logs a metric its step already has is a
    duplicate (never expected of one writer) and merges nothing. An attempt's first logged step is
    where it took over: a record of attempt a at step s is superseded when a later attempt first
    logged at or before s."""
    first_step: dict[int, int] = {}
    merged: dict[tuple[int, int], Record] = {}
    duplicated: list[Record] = []
    for record in sorted(records, key=lambda r: r.seq):
        key = (record.attempt, record.step)
        earlier = merged.get(key)
        if earlier is None:
            merged[key] = record
        elif earlier.metrics.keys() & record.metrics.keys():
            duplicated.append(record)
            continue
        else:
            merged[key] = replace(earlier, metrics={**earlier.metrics, **record.metrics})
        first_step[record.attempt] = min(first_step.get(record.attempt, record.step), record.step)
    # The earliest step any later attempt took over at, for each attempt.
    taken_over_at: dict[int, float] = {}
    earliest = math.inf
    for attempt in sorted(first_step, reverse=True):
        taken_over_at[attempt] = earliest
        earliest = min(earliest, first_step[attempt])
    live: list[Record] = []
    superseded: list[Record] = []
    for (attempt, step), record in merged.items():
        (superseded if step >= taken_over_at[attempt] else live).append(record)
    live.sort(key=lambda r: r.step)
    superseded.sort(key=lambda r: (r.attempt, r.step))
    return History(live, superseded, duplicated)


def _plain(value: Any) -> Any:
    """`value` as strict JSON: mappings and sequences kept, non-finite floats as in records, a
    one-element tensor or NumPy scalar as its number, anything else as its text."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, set | frozenset):
        return sorted((_plain(item) for item in value), key=str)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return _encode_value(value)
    if single_number(value):
        return _plain(value.item())
    return str(value)


def single_number(value: Any) -> bool:
    """A one-element tensor (`numel()`) or NumPy value (`size`): one number behind `.item()`."""
    if not hasattr(value, "item"):
        return False
    numel = getattr(value, "numel", None)
    return bool(numel() == 1) if callable(numel) else getattr(value, "size", None) == 1


def unloggable(value: Any) -> str:
    """Why `value` cannot be a metric's value ("" when it can): a real number, or a one-element real tensor or NumPy
    value. Its type and element count only, never its value: a CUDA tensor's would wait for the device."""
    if isinstance(value, int | float):  # bool too
        return ""
    if not single_number(value):
        shape = getattr(value, "shape", None)
        return f"a {type(value).__name__}" + (f" of shape {tuple(shape)}" if shape is not None else "")
    is_complex = getattr(value, "is_complex", None)  # a tensor's dtype; NumPy's says its kind
    if is_complex() if callable(is_complex) else getattr(getattr(value, "dtype", None), "kind", "f") == "c":
        return f"a complex {type(value).__name__}"
    return ""


def hyperparams_document(params: Mapping[str, Any]) -> bytes:
    """The body of `hyperparams_key`: strict JSON, keys sorted, so equal values give equal bytes."""
    return json.dumps(_plain(params), sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


@dataclass(frozen=True)
class ChunkSummary:
    """What one event chunk holds, without its records: an entry of the run's index."""

    chunk: int
    records: int
    first_seq: int
    last_seq: int
    first_step: int
    last_step: int
    attempts: tuple[int, ...]
    first_wall_time: float
    last_wall_time: float

    @classmethod
    def of(cls, chunk: int, records: list[Record]) -> ChunkSummary:
        return cls(
            chunk=chunk,
            records=len(records),
            first_seq=min(r.seq for r in records),
            last_seq=max(r.seq for r in records),
            first_step=min(r.step for r in records),
            last_step=max(r.step for r in records),
            attempts=tuple(sorted({r.attempt for r in records})),
            first_wall_time=min(r.wall_time for r in records),
            last_wall_time=max(r.wall_time for r in records),
        )

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "attempts": list(self.attempts)}

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> ChunkSummary:
        """An index entry; ValueError naming the field when it is not one (a reader sets its document aside)."""
        if not isinstance(body, Mapping):
            raise ValueError(f"an index entry is not a JSON object but {type(body).__name__}")
        values: dict[str, Any] = {}
        for name in ("chunk", "records", "first_seq", "last_seq", "first_step", "last_step"):
            value = body.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: {value!r} is not a count")
            values[name] = value
        for name in ("first_wall_time", "last_wall_time"):
            value = body.get(name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{name}: {value!r} is not a time")
            values[name] = float(value)
        attempts = body.get("attempts")
        if not isinstance(attempts, list) or not all(type(a) is int and a >= 0 for a in attempts):
            raise ValueError(f"attempts: {attempts!r} is not a list of attempts")
        return cls(**values, attempts=tuple(attempts))


def index_document(group: int, summaries: list[ChunkSummary]) -> bytes:
    body = {"group": group, "chunks_per_group": INDEX_GROUP, "chunks": [s.to_dict() for s in summaries]}
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


def summaries_of(document: bytes) -> list[ChunkSummary]:
    return [ChunkSummary.from_dict(entry) for entry in json.loads(document)["chunks"]]


def records_of(body: bytes | str) -> list[Record]:
    """Every record of one event chunk (or spool file), in order."""
    lines = body.splitlines() if isinstance(body, str) else body.decode().splitlines()
    return [Record.from_line(line) for line in lines if line.strip()]


# The metric every record of a training loop is expected to carry; the loss curve, the loss alarms
# and the doctor's divergence verdict read it.
LOSS_KEY = "loss"


class FinalState(StrEnum):
    """How a run ended, written once at its end (`final_status_key`). A run with none and no
    heartbeat had no clean exit: killed, its node lost, or its process hung until it was removed."""

    FINISHED = "finished"
    FAILED = "failed"  # with the exception's type
    PREEMPTED = "preempted"  # SIGTERM: spot interruption, eviction, a stopped SageMaker job


# The fields a reader uses of a final state (`final_status_key`), and their types.
FINAL_FIELDS: dict[str, type | tuple[type, ...]] = {
    "state": str, "attempt": int, "ended_at": NUMBER, "last_step": int, "unacknowledged_records": int,
    "checkpoints": list, "checkpoints_skipped": list, "values_set_aside": dict, "spool_unfinished": bool,
    "values_lost": dict,
}  # fmt: skip


def final_state_superseded(
    final: Mapping[str, Any], *, attempts: Iterable[int] = (), attempts_started_at: Iterable[float] = ()
) -> bool:
    """The one final-state rule, for `beacon.sync` and every reader: a final state (`final_status_key`) is an earlier
    attempt's once a later attempt started, as its records show (`attempts`: a number above the final state's; one
    written without a number, by a release before final states named their attempt, is judged by the time alone)
    or its preflight (`attempts_started_at`: an attempt that started after the final state's end). Each attempt's
    end rewrites the key, so until the running attempt ends it still holds the one before's."""
    attempt = final.get("attempt")
    if isinstance(attempt, int) and not isinstance(attempt, bool) and any(a > attempt for a in attempts):
        return True
    ended = final.get("ended_at")
    if not isinstance(ended, int | float) or isinstance(ended, bool):
        return False
    return any(started > ended for started in attempts_started_at)


def final_state_document(body: bytes) -> dict[str, Any]:
    """A final state as a reader takes it; ValueError naming the field when it is not one (a state a run does not
    end in included)."""
    document = checked_object(body, FINAL_FIELDS)
    if document.get("state") not in {*FinalState, None}:
        raise ValueError(f"state: {document['state']!r} is not a state a run ends in")
    return document


# --- Log lines ---------------------------------------------------------------------------
# Rank 0 logs one progress line every few steps: people read it in pod logs, and SageMaker's
# metric definitions parse it (the regexes below are what `beacon smoke` sends).
PROGRESS_LOG_INTERVAL = 10


def progress_line(step: int, loss: float) -> str:
    return f"beacon-progress step={step} loss={loss:.6f}"


PROGRESS_LOG_METRICS = {
    "step": r"beacon-progress step=(\d+)",
    "loss": r"beacon-progress step=\d+ loss=([0-9.eE+-]+)",
}
