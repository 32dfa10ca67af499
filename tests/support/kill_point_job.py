"""`python -m tests.support.kill_point_job POINT N JOB-ARGS...`: the real training job, SIGKILLed at
the N-th time it reaches the durable-state transition POINT (beacon/kill_points.py).

A kill-point test places the kill exactly where a crash hurts most, instead of at a random sleep.
"""

from __future__ import annotations

import os
import signal
import sys

from beacon import kill_points
from smoke_job.train import main


def kill_at(point: str, nth: int) -> None:
    if point not in kill_points.ALL:
        raise SystemExit(f"unknown kill point {point!r}; one of {', '.join(kill_points.ALL)}")
    hits = 0

    def handler(name: str) -> None:
        nonlocal hits
        if name == point:
            hits += 1
            if hits == nth:
                os.kill(os.getpid(), signal.SIGKILL)

    kill_points.install(handler)


if __name__ == "__main__":
    kill_at(sys.argv[1], int(sys.argv[2]))
    sys.exit(main(sys.argv[3:]))
