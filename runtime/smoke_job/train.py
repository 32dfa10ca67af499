"""Entry point: `python -m smoke_job.train ...` or `torchrun --nproc-per-node N -m smoke_job.train ...`.

Parses the flags into a JobConfig, starts the run with `beacon.init`, trains. Exit codes: 0 done and
delivered, 2 bad input, 3 preflight failed, 70 training failed (drained first), 71 the spool's volume
kept failing (not full), 74 spool full, 75 stopped with records still waiting in the spool.
"""

from __future__ import annotations

import json
import logging
import sys

import beacon

from smoke_job.config import parse_args
from smoke_job.job import Job

EXIT_PREFLIGHT = 3


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("botocore").setLevel(logging.WARNING)
    config = parse_args(argv)
    try:
        run = beacon.init(settings=config.settings)
    except beacon.PreflightError as error:
        print(f"beacon preflight: {error}", file=sys.stderr, flush=True)
        return EXIT_PREFLIGHT
    summary = Job(config, run).train()
    # One write of the whole line: unbuffered, print() writes the text and the newline apart, and
    # two ranks sharing a pipe interleave them.
    sys.stdout.write(json.dumps({"beacon": "job-finished", **summary}) + "\n")
    sys.stdout.flush()
    return int(summary["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
