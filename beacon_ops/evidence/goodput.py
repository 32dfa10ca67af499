"""A run's goodput ledger from what it left in S3 (issue 30): its records, live or superseded (`contract.history`),
each passed start's preflight time and the final state's end, through the contract's arithmetic
(`beacon.contract.goodput`). As far as the evidence goes: phases and pod times are not written yet, so their time
is counted as the steps or the setup around them, and each attempt begins at its preflight."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from beacon import contract
from beacon.contract.goodput import PRICES_AS_OF, Attempt, Category, Cost, Ledger, cost_of, ledger

from beacon_ops.evidence.reading import RunEvidence


def attempts_of(evidence: RunEvidence, *, instances: int = 1) -> list[Attempt]:
    """Each attempt with records: it begins at the newest preflight of a passed start at or before its first record
    (its first record, where none is: a run from before preflights, whose setup is then unknown) and ends at its last
    record, or at the final state's end for the attempt that wrote it."""
    history = contract.history(evidence.records)
    live = {(record.attempt, record.step) for record in history.live}
    by_attempt: dict[int, list[contract.Record]] = {}
    for record in sorted(evidence.records, key=lambda r: r.seq):
        by_attempt.setdefault(record.attempt, []).append(record)
    starts = sorted(t for p in evidence.preflights if (t := _seconds(p.get("started_at"))) is not None)
    final = evidence.final or {}
    attempts = []
    for number, records in sorted(by_attempt.items()):
        times = [(r.wall_time, (r.attempt, r.step) in live) for r in records]
        first, last = times[0][0], times[-1][0]
        process_start = max((t for t in starts if t <= first), default=first)
        ended_at = final.get("ended_at")
        end = last
        if final.get("attempt") == number and isinstance(ended_at, int | float) and ended_at >= last:
            end = float(ended_at)
        attempts.append(Attempt(number, instances, end=end, process_start=process_start, record_times=times))
    return attempts


def run_ledger(evidence: RunEvidence, *, instances: int = 1) -> Ledger:
    return ledger(attempts_of(evidence, instances=instances))


def _seconds(iso: object) -> float | None:
    if not isinstance(iso, str):
        return None
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


# --- the report `beacon goodput` prints: the ledger, a bar per attempt, the dollars where the run is placed ------
BAR_WIDTH = 60
# One mark per category in the bars, in PRECEDENCE's order and then the rest
MARKS = {
    Category.PRODUCTIVE: "#", Category.START: "s", Category.SETUP: "u", Category.CHECKPOINT: "c",
    Category.EVALUATION: "e", Category.HANG: "H", Category.WASTED_PROGRESS: "w", Category.RESTART_GAP: "g",
    Category.UNACCOUNTED: "?",
}  # fmt: skip


# What no run records yet, so every ledger says what it cannot tell apart (issue 30 builds the evidence)
NOT_YET_RECORDED = (
    "no phase intervals are recorded yet: checkpoint and evaluation time counts in the steps around it",
    "no pod or node times are recorded yet: each attempt begins at its process's preflight (no start time), and "
    "ends at its last record: a hang until the kill counts in the restart gap after it, and after the run's last "
    "attempt in no category",
)


@dataclass(frozen=True)
class GoodputReport:
    experiment: str
    run: str
    book: Ledger
    instances: int
    instance_type: str  # "" where no document recorded it
    why_instances: str  # where the instance count comes from
    prices: dict[str, dict[str, float]]  # the team's own, over the list prices

    def cost(self, seconds: float) -> Cost:
        """`seconds` of the run's instance-seconds, priced (the instance count is already in them)."""
        return cost_of(seconds, instances=1, instance_type=self.instance_type, prices=self.prices)

    def as_dict(self) -> dict[str, Any]:
        total = self.cost(self.book.total)
        return {
            "experiment": self.experiment,
            "run": self.run,
            "instances": self.instances,
            "instance_type": self.instance_type,
            "goodput": self.book.goodput(),
            "instance_seconds": {c.value: s for c, s in self.book.seconds.items()},
            "unaccounted_why": self.book.why,
            "attempts": {n: {c.value: s for c, s in b.seconds.items()} for n, b in self.book.by_attempt.items()},
            "instance_hours": total.instance_hours,
            "dollars": total.dollars,
            "prices": total.source if total.hourly is not None else f"list prices of {PRICES_AS_OF}",
            "notes": list(NOT_YET_RECORDED),
        }

    def lines(self) -> list[str]:
        book, total = self.book, self.cost(self.book.total)
        attempts = len(book.by_attempt)
        head = (f"run {self.run} (experiment {self.experiment}): {attempts} attempt{'s' if attempts != 1 else ''} on "
                f"{self.instances} instance{'s' if self.instances != 1 else ''} ({self.why_instances}); goodput "
                f"{book.goodput():.1%} of {total.priced()}")  # fmt: skip
        lines = [head, "", f"  {'category':<16} {'instance time':>13} {'share':>7}  {'dollars':>9}"]
        for category in Category:
            seconds = book.seconds[category]
            dollars = self.cost(seconds).dollars
            shown = "" if dollars is None else f"${dollars:,.2f}"
            share = seconds / book.total if book.total else 0.0
            lines.append(f"  {category.value:<16} {clock(seconds):>13} {share:>7.1%}  {shown:>9}")
        lines += [f"    unaccounted: {why}: {clock(seconds)}" for why, seconds in book.why.items()]
        lines += ["", f"  attempts (each mark is 1/{BAR_WIDTH} of the run's instance-seconds):"]
        for number, attempt in sorted(book.by_attempt.items()):
            lines.append(f"  {number:>3} {bar(attempt, book.total)}")
        legend = ", ".join(f"{mark} {category.value}" for category, mark in MARKS.items())
        lines += [f"  ({legend})", "", *(f"  note: {note}" for note in NOT_YET_RECORDED)]
        return lines


def clock(seconds: float) -> str:
    """Instance-seconds as h:mm:ss."""
    whole = round(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def bar(attempt: Ledger, run_total: float) -> str:
    """The attempt's categories as marks, each BAR_WIDTH-th of the run's total: the attempts' bars add up to it."""
    if run_total <= 0:
        return ""
    return "".join(MARKS[c] * round(attempt.seconds[c] / run_total * BAR_WIDTH) for c in MARKS)


def goodput_report(evidence: RunEvidence, *, prices: dict[str, dict[str, float]] | None = None) -> GoodputReport:
    """The run's ledger at the instance count its ranks' documents place it on (each node once; 1 where none does),
    with the instance type they recorded, for its dollars."""
    documents, _ = evidence.ranks()
    nodes = {d.node: d.instance for d in documents if d.node}
    instances = max(1, len(nodes))
    kinds = {kind for kind in nodes.values() if kind}
    why = (f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} in the ranks' documents" if nodes
           else "no rank document places it: counted as one")  # fmt: skip
    return GoodputReport(evidence.experiment, evidence.run, run_ledger(evidence, instances=instances), instances,
                         kinds.pop() if len(kinds) == 1 else "", why, prices or {})  # fmt: skip


# --- a period of the team's runs: `beacon goodput --since 30d` -----------------------------------------------------
def runs_since(s3: Any, bucket: str, since: datetime) -> tuple[list[tuple[str, str]], int]:
    """(experiment, run) of every run a start of which wrote its preflight record at or after `since`, newest first;
    and how many runs have no preflight record to date them (left out)."""
    dated: list[tuple[datetime, str, str]] = []
    undated = 0
    for experiment in _folders(s3, bucket, contract.EXPERIMENTS_PREFIX):
        for run in _folders(s3, bucket, f"{contract.EXPERIMENTS_PREFIX}{experiment}/"):
            prefix = contract.preflight_key(experiment, run, "")
            times = [o["LastModified"] for page in s3.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix) for o in page.get("Contents", [])]  # fmt: skip
            if not times:
                undated += 1
            elif max(times) >= since:
                dated.append((max(times), experiment, run))
    return [(experiment, run) for _, experiment, run in sorted(dated, reverse=True)], undated


def _folders(s3: Any, bucket: str, prefix: str) -> list[str]:
    names = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
        names += [p["Prefix"].removeprefix(prefix).rstrip("/") for p in page.get("CommonPrefixes", [])]
    return names


@dataclass(frozen=True)
class PeriodReport:
    """Every run of a period, the worst first: the most instance time not spent on the live history's steps."""

    since: datetime
    reports: list[GoodputReport]
    undated: int  # runs left out: no preflight record dates them
    without_records: int = 0  # runs of the period left out: no step recorded

    @property
    def prices(self) -> str:
        own = any(any(r.prices.values()) for r in self.reports)
        return f"list prices of {PRICES_AS_OF}" + (", and the team's own where it states one" if own else "")

    def __post_init__(self) -> None:
        self.reports.sort(key=lambda r: r.book.total - r.book.seconds[Category.PRODUCTIVE], reverse=True)

    def totals(self) -> tuple[float, float, float | None]:
        """Instance-seconds, productive instance-seconds, and dollars where every run is priced (else None)."""
        total = sum(r.book.total for r in self.reports)
        productive = sum(r.book.seconds[Category.PRODUCTIVE] for r in self.reports)
        dollars = [r.cost(r.book.total).dollars for r in self.reports]
        return total, productive, None if None in dollars else sum(d for d in dollars if d is not None)

    def as_dict(self) -> dict[str, Any]:
        total, productive, dollars = self.totals()
        return {"since": self.since.isoformat(), "runs": [r.as_dict() for r in self.reports], "undated": self.undated,
                "instance_seconds": total, "goodput": productive / total if total else 0.0, "dollars": dollars,
                "without_records": self.without_records, "prices": self.prices}  # fmt: skip

    def lines(self) -> list[str]:
        total, productive, dollars = self.totals()
        runs = len(self.reports)
        priced = f", ${dollars:,.2f} ({self.prices})" if dollars is not None else ""
        head = (f"since {self.since:%Y-%m-%d %H:%M} UTC: {runs} run{'s' if runs != 1 else ''}, instance time "
                f"{clock(total)}, goodput {productive / total if total else 0.0:.1%}{priced}")  # fmt: skip
        lines = [head, "", f"  {'run':<32} {'experiment':<16} {'attempts':>8} {'instance time':>13} {'goodput':>8} "
                           f"{'not productive':>14} {'dollars':>9}"]  # fmt: skip
        for r in self.reports:
            waste = r.book.total - r.book.seconds[Category.PRODUCTIVE]
            cost = r.cost(r.book.total).dollars
            shown = "" if cost is None else f"${cost:,.2f}"
            lines.append(f"  {r.run:<32} {r.experiment:<16} {len(r.book.by_attempt):>8} {clock(r.book.total):>13} "
                         f"{r.book.goodput():>8.1%} {clock(waste):>14} {shown:>9}")  # fmt: skip
        if self.undated:
            lines.append(f"  ({self.undated} run(s) with no preflight record to date them: left out)")
        if self.without_records:
            lines.append(f"  ({self.without_records} run(s) of the period with no step recorded: left out)")
        return lines
