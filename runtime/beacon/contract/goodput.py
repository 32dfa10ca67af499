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
    # The run's ledger: each attempt's own, the restart gap before it included (they sum to the run's)
    by_attempt: dict[int, Ledger] = field(default_factory=dict)

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
    run = Ledger()
    cursor: float | None = None  # where the run's accounted time has reached
    previous: Attempt | None = None
    for attempt in sorted(attempts, key=lambda a: a.attempt):
        book = run.by_attempt.setdefault(attempt.attempt, Ledger())
        begin = _begin(attempt) if cursor is None else max(_begin(attempt), cursor)
        end = max(attempt.end, begin)
        if previous is not None and cursor is not None:
            book._add(Category.RESTART_GAP, (begin - cursor) * previous.instances)
        _account(book, attempt, begin, end)
        cursor, previous = end, attempt
    for book in run.by_attempt.values():
        for category, seconds in book.seconds.items():
            run.seconds[category] += seconds
        for why, seconds in book.why.items():
            run.why[why] = run.why.get(why, 0.0) + seconds
    return run


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


# --- dollars: instance-hours at the instance's hourly price ------------------------------------------------------
@dataclass(frozen=True)
class InstancePrice:
    gpus: int
    on_demand_hourly: float  # USD, Linux, PRICES_REGION


# List prices by hand, dated (every figure priced from them says the date); nothing here calls a pricing API. Spot
# prices move by the hour: a spot instance is priced only where a team states its price. Check before quoting.
PRICES_AS_OF = "2026-12-01"
PRICES_REGION = "us-east-1"
INSTANCE_PRICES: dict[str, InstancePrice] = {
    "m7i.large": InstancePrice(0, 0.1008),
    "m7i.xlarge": InstancePrice(0, 0.2016),
    "g5.xlarge": InstancePrice(1, 1.006),
    "g5.12xlarge": InstancePrice(4, 5.672),
    "g5.48xlarge": InstancePrice(8, 16.288),
    "g6.xlarge": InstancePrice(1, 0.8048),
    "g6.12xlarge": InstancePrice(4, 4.6016),
    "g6.48xlarge": InstancePrice(8, 13.3504),
    "g6e.xlarge": InstancePrice(1, 1.861),
    "g6e.12xlarge": InstancePrice(4, 10.493),
    "g6e.48xlarge": InstancePrice(8, 30.131),
    "p4d.24xlarge": InstancePrice(8, 21.96),
    "p5.48xlarge": InstancePrice(8, 55.04),
    "ml.m5.xlarge": InstancePrice(0, 0.23),
    "ml.g5.xlarge": InstancePrice(1, 1.408),
}
ON_DEMAND, SPOT = "on-demand", "spot"


@dataclass(frozen=True)
class Cost:
    """What `instances` instances of one type cost over `seconds` (or per hour, `rate`): instance-hours, and dollars
    where the type's price is known."""

    seconds: float
    instances: int
    instance_type: str
    capacity: str  # on-demand or spot; "" where nothing recorded it (priced as on-demand, and said so)
    hourly: float | None  # one instance's, None: no price known
    source: str  # where the price came from: "list prices of <date>", "the team's prices"

    @property
    def instance_hours(self) -> float:
        return self.seconds * self.instances / 3600

    @property
    def dollars(self) -> float | None:
        return None if self.hourly is None else self.instance_hours * self.hourly

    def on(self) -> str:
        """`2 instances of g6.12xlarge`."""
        plural = "s" if self.instances != 1 else ""
        return f"{self.instances} instance{plural} of {self.instance_type or 'an unrecorded type'}"

    def priced(self) -> str:
        """`0.51 instance-hours, $2.35 at on-demand (list prices of 2026-12-01)`, or why there is no dollar figure."""
        hours = f"{self.instance_hours:.2f} instance-hours"
        if self.dollars is None and not self.instance_type:
            return f"{hours} (no instance type recorded)"
        if self.dollars is None:
            kind = self.capacity or ON_DEMAND
            return f"{hours} (no {kind} price for {self.instance_type} in the list prices of {PRICES_AS_OF})"
        at = self.capacity or f"{ON_DEMAND} (capacity type not recorded)"
        return f"{hours}, ${_dollars(self.dollars)} at {at} ({self.source})"


def cost_of(
    seconds: float,
    *,
    instances: int,
    instance_type: str,
    capacity: str = "",
    prices: dict[str, dict[str, float]] | None = None,
) -> Cost:
    """The cost of `instances` instances of `instance_type` for `seconds`: at the team's own price for it (`prices`:
    {"on-demand": {type: hourly}, "spot": {...}}, negotiated rates) where it states one, else the list price
    (on-demand only: spot moves by the hour)."""
    kind = capacity or ON_DEMAND
    own = (prices or {}).get(kind, {}).get(instance_type)
    if own is not None:
        return Cost(seconds, instances, instance_type, capacity, own, "the team's prices")
    listed = INSTANCE_PRICES.get(instance_type)
    hourly = listed.on_demand_hourly if listed is not None and kind == ON_DEMAND else None
    return Cost(seconds, instances, instance_type, capacity, hourly, f"list prices of {PRICES_AS_OF}")


def _dollars(amount: float) -> str:
    return f"{amount:,.0f}" if amount >= 100 else f"{amount:,.2f}"
