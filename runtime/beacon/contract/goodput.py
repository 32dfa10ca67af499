"""Where a run's instance-hours went: the goodput ledger's arithmetic (issue 30), pure and without I/O, so the
runtime, the operator (`beacon goodput`, the doctor's cost of a hang) and the alarm's function share it.

Every instance-second from an attempt's first pod to its end, and of the gaps between attempts, goes into exactly
one category. Where two apply, the first of `PRECEDENCE` wins: a rank hung inside a checkpoint is a hang; an
evaluation during a step later redone is evaluation; what is neither a phase nor a step is the attempt's start,
setup, or left *unaccounted* with the reason, never hidden.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class Category(StrEnum):
    PRODUCTIVE = "productive"  # the time of steps in the live history
    START = "start"  # the first pod created (SageMaker: Starting) to the process start: nodes, image pull
    SETUP = "setup"  # the process start to the attempt's first step: preflight, resume, model load, compile
    CHECKPOINT = "checkpoint"  # the training thread inside a checkpoint phase
    EVALUATION = "evaluation"  # ... inside an evaluation phase
    HANG = "hang"  # the last progress before a stall to the end of that attempt
    WASTED_PROGRESS = "wasted_progress"  # the time of steps later superseded: done, lost at a restart, done again
    RESTART_GAP = "restart_gap"  # an attempt's end to the next attempt's first pod
    UNACCOUNTED = "unaccounted"  # what is left: with why


# Where two categories cover the same second, the first named here takes it.
PRECEDENCE = (
    Category.HANG,
    Category.CHECKPOINT,
    Category.EVALUATION,
    Category.WASTED_PROGRESS,
    Category.PRODUCTIVE,
    Category.SETUP,
    Category.START,
)
PHASE_CATEGORIES = {"checkpoint": Category.CHECKPOINT, "evaluation": Category.EVALUATION}


@dataclass(frozen=True)
class PhaseInterval:
    name: str  # "checkpoint", "evaluation"; other phases (a team's own) count as the time under them would
    start: float
    end: float


@dataclass(frozen=True)
class Attempt:
    """One attempt's timeline, wall-clock seconds. `record_times`: the wall time of each step's record in the order
    logged, with whether that step is in the live history (False: superseded by a later attempt). A step's time
    runs from the record before it (or the attempt's first record, whose own time is setup's end) to its own."""

    attempt: int
    instances: int
    end: float
    process_start: float
    # None: the orchestrator's view was not kept (a run that predates it): the attempt is accounted from its process
    # start; the time before it is the restart gap after an earlier attempt, and in no category before the first.
    pod_created: float | None = None
    record_times: Sequence[tuple[float, bool]] = ()
    phases: Sequence[PhaseInterval] = ()
    # The last progress before a stall that lasted to the attempt's end (the doctor's stall rule: a rank inside a
    # checkpoint past its phase limit hung from the checkpoint's start, its last progress).
    hang_from: float | None = None


@dataclass
class Ledger:
    """Instance-seconds by category; `why` says what the unaccounted seconds are."""

    seconds: dict[Category, float] = field(default_factory=lambda: dict.fromkeys(Category, 0.0))
    why: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def goodput(self) -> float:
        """Productive over all: 0 for a run with no time at all."""
        return self.seconds[Category.PRODUCTIVE] / self.total if self.total > 0 else 0.0

    def _add(self, category: Category, seconds: float, why: str = "") -> None:
        if seconds > 0:
            self.seconds[category] += seconds
            if category is Category.UNACCOUNTED:
                self.why[why] = self.why.get(why, 0.0) + seconds


def ledger(attempts: Iterable[Attempt]) -> Ledger:
    """The run's ledger: each attempt's own time, then each gap before the next attempt (at the ending attempt's
    instance count: the gap's nodes are those it held). Attempts are taken in their order; one whose clock says it
    began before the one before it ended (a pod's time against a process's) begins at that end, so no second is
    counted twice. The categories sum to the run's instance-seconds (to the floats' rounding)."""
    book = Ledger()
    cursor: float | None = None  # where the run's accounted time has reached
    previous: Attempt | None = None
    for attempt in sorted(attempts, key=lambda a: a.attempt):
        begin = _begin(attempt) if cursor is None else max(_begin(attempt), cursor)
        end = max(attempt.end, begin)
        if previous is not None and cursor is not None:
            book._add(Category.RESTART_GAP, (begin - cursor) * previous.instances)
        _account(book, attempt, begin, end)
        cursor, previous = end, attempt
    return book


def _begin(attempt: Attempt) -> float:
    return attempt.pod_created if attempt.pod_created is not None else attempt.process_start


def _account(book: Ledger, attempt: Attempt, begin: float, end: float) -> None:
    if end <= begin:
        return
    spans: list[tuple[float, float, Category]] = []  # (start, end, category), any overlap; precedence decides
    if attempt.pod_created is not None:
        spans.append((attempt.pod_created, attempt.process_start, Category.START))
    times = [t for t, _ in attempt.record_times]
    first = times[0] if times else end
    spans.append((attempt.process_start, first, Category.SETUP))
    for (before, _), (after, live) in zip(attempt.record_times, attempt.record_times[1:], strict=False):
        spans.append((before, after, Category.PRODUCTIVE if live else Category.WASTED_PROGRESS))
    for phase in attempt.phases:
        if (category := PHASE_CATEGORIES.get(phase.name)) is not None:
            spans.append((phase.start, phase.end, category))
    if attempt.hang_from is not None:
        spans.append((attempt.hang_from, end, Category.HANG))
    covered = _by_precedence(spans, begin, end, attempt.instances, book)
    # What no span took: after the last step (the drain, the exit), or a stretch no evidence covers.
    last = times[-1] if times else first
    for start, stop in _minus(begin, end, covered):
        why = "after the last step: the drain and the exit" if start >= last else "no evidence covers it"
        book._add(Category.UNACCOUNTED, (stop - start) * attempt.instances, why)


def _by_precedence(
    spans: list[tuple[float, float, Category]], begin: float, end: float, instances: int, book: Ledger
) -> list[tuple[float, float]]:
    """Give each second inside [begin, end) to the first category of PRECEDENCE covering it; the covered intervals."""
    taken: list[tuple[float, float]] = []  # disjoint, sorted
    for category in PRECEDENCE:
        for start, stop in sorted((max(s, begin), min(e, end)) for s, e, c in spans if c is category):
            for piece_start, piece_stop in _minus(start, stop, taken):
                book._add(category, (piece_stop - piece_start) * instances)
                _insert(taken, piece_start, piece_stop)
    return taken


def _minus(start: float, stop: float, taken: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """[start, stop) less the disjoint sorted intervals `taken`."""
    pieces = []
    index = max(bisect.bisect_right(taken, (start, float("inf"))) - 1, 0)
    cursor = start
    for taken_start, taken_stop in taken[index:]:
        if taken_start >= stop:
            break
        if taken_stop <= cursor:
            continue
        if taken_start > cursor:
            pieces.append((cursor, taken_start))
        cursor = max(cursor, taken_stop)
    if cursor < stop:
        pieces.append((cursor, stop))
    return pieces


def _insert(taken: list[tuple[float, float]], start: float, stop: float) -> None:
    """Add a piece that overlaps nothing in `taken`, merging with its neighbours."""
    index = bisect.bisect_left(taken, (start, stop))
    if index > 0 and taken[index - 1][1] == start:
        index -= 1
        start = taken.pop(index)[0]
    if index < len(taken) and taken[index][0] == stop:
        stop = taken.pop(index)[1]
    taken.insert(index, (start, stop))
