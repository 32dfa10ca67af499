"""A run's goodput ledger from what it left in S3 (issue 30): its records, live or superseded (`contract.history`),
each passed start's preflight time and the final state's end, through the contract's arithmetic
(`beacon.contract.goodput`). As far as the evidence goes: phases and pod times are not written yet, so their time
is counted as the steps or the setup around them, and each attempt begins at its preflight."""

from __future__ import annotations

from datetime import datetime

from beacon import contract
from beacon.contract.goodput import Attempt, Ledger, ledger

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
