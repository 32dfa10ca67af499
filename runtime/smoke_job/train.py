"""Entry point: `python -m smoke_job.train ...` or `torchrun --nproc-per-node N -m smoke_job.train ...`.

Parses the flags into a JobConfig, builds the job, runs it. Exit codes: 0 done and delivered,
2 bad input, 3 preflight failed, 70 training failed (drained first), 71 the spool's volume kept failing
(not full), 74 spool full, 75 stopped with records still waiting in the spool.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from types import FrameType

from beacon.config import generated_run_id, parse_args
from beacon.distributed import world_from_environment
from beacon.lifeline import die_with_parent
from beacon.liveness import Liveness
from beacon.preflight import PreflightError

from smoke_job.job import Job

EXIT_PREFLIGHT = 3
FINISH_MARGIN_S = 30.0  # beyond rank 0's drain budget: its final checkpoint and the last uploads


def install_stop_handlers() -> threading.Event:
    """SIGTERM (eviction, Karpenter, SageMaker stop) and SIGINT: stop stepping, then drain."""
    stop = threading.Event()

    def handler(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("beacon").warning(
            "received %s: finishing the step, then draining", signal.Signals(signum).name
        )
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ


def main(argv: list[str] | None = None) -> int:
    if launched_by_torchrun():
        die_with_parent(signal.SIGTERM)  # a killed launcher: drain, rather than run on as an orphan
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("botocore").setLevel(logging.WARNING)
    config = parse_args(argv)
    stop = install_stop_handlers()
    with world_from_environment() as world:
        # Every rank's own sign of life, from before setup until the drain is over.
        liveness = Liveness(config.heartbeat_file, local_rank=world.local_rank, interval=config.heartbeat_interval)
        liveness.start()
        try:
            config = config.with_run(world.broadcast(config.run or generated_run_id()))
            try:
                job = Job.build(config, world, stop)
            except PreflightError as error:
                print(f"beacon preflight: {error}", file=sys.stderr, flush=True)
                return EXIT_PREFLIGHT
            summary = job.run()
            world.finish_together(config.shutdown_budget + FINISH_MARGIN_S)
        finally:
            liveness.stop()
    # One write of the whole line: unbuffered, print() writes the text and the newline apart, and
    # two ranks sharing a pipe interleave them.
    sys.stdout.write(json.dumps({"beacon": "job-finished", **summary}) + "\n")
    sys.stdout.flush()
    return int(summary["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
