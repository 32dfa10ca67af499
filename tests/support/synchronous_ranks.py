"""Ranks of a synchronous job on one scripted clock, each with its own `StepPace` (issue 31): for the straggler's
tests and the slow alarm's, without processes or sleeps."""

from __future__ import annotations

from beacon.contract.pace import Straggler, straggler_of
from beacon.evidence.step_pace import StepPace


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class SynchronousRanks:
    """Ranks of a synchronous job on one scripted clock: each arrives at its step's collective after its own work,
    leaves it when the last one arrived (plus the all_reduce itself), and finishes the step there."""

    ALL_REDUCE_S = 0.01

    def __init__(self, ranks: int) -> None:
        self.clock = Clock()
        self.paces = [StepPace(self.clock) for _ in range(ranks)]
        for pace in self.paces:
            pace.timing = True
            pace.step_finished()
        self.intervals: list[float] = []

    def step(self, work_s: list[float]) -> None:
        began = self.clock.t
        arrivals = [began + w for w in work_s]
        done = max(arrivals) + self.ALL_REDUCE_S
        for pace, arrival in zip(self.paces, arrivals, strict=True):
            self.clock.t = arrival
            began = pace.clock()
            self.clock.t = done
            pace.waited(began)
        for pace in self.paces:
            pace.step_finished()
        self.intervals.append(done - began)

    def straggler(self) -> Straggler | None:
        return straggler_of([pace.of_rank(rank) for rank, pace in enumerate(self.paces)])
