"""Entry point: `python -m smoke_job.train ...` or `torchrun --nproc-per-node N -m smoke_job.train ...`.

Parses the flags into a JobConfig, starts the run with `beacon.init`, trains. Exit codes: 0 done and
delivered, 2 bad input, 3 preflight failed, 70 training failed (drained first), 71 the spool's volume
kept failing (not full), 74 spool full, 75 stopped with records still waiting in the spool.
"""

from __future__ import annotations

import signal
from types import FrameType

# A stop can come while torch is still being imported (seconds on a busy node): remember it, and
# hand it to the run once `beacon.init` has taken over the handlers.
_stop_signals: list[str] = []


def _remember(signum: int, _frame: FrameType | None) -> None:
    _stop_signals.append(signal.Signals(signum).name)


signal.signal(signal.SIGTERM, _remember)
signal.signal(signal.SIGINT, _remember)

import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402

import beacon  # noqa: E402
from beacon import contract  # noqa: E402

from smoke_job.config import parse_args  # noqa: E402
from smoke_job.job import Job  # noqa: E402

EXIT_PREFLIGHT = contract.EXIT_PREFLIGHT


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("botocore").setLevel(logging.WARNING)
    config = parse_args(argv)
    try:
        run = beacon.init(settings=config.settings)
    except beacon.PreflightError as error:
        print(f"beacon preflight: {error}", file=sys.stderr, flush=True)
        return EXIT_PREFLIGHT
    if _stop_signals:
        run.request_stop(_stop_signals[0])
    summary = Job(config, run).train()
    # One write of the whole line: unbuffered, print() writes the text and the newline apart, and
    # two ranks sharing a pipe interleave them.
    sys.stdout.write(json.dumps({"beacon": "job-finished", **summary}) + "\n")
    sys.stdout.flush()
    return int(summary["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
