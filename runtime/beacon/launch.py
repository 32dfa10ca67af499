"""The container's entry point: torchrun, with the job's own exit code and its graceful stop kept.

- torchrun exits 1 whenever a worker fails, so the Job's podFailurePolicy could not tell bad input
  (2) or a failed preflight (3), which no retry fixes, from a crash worth retrying. This runs torchrun
  in this process and exits with the first failing worker's code (128 + N if signal N killed it).
- Kubernetes and SageMaker send SIGTERM to the container's first process only. torchrun's own
  handler would stop the workers and exit with an error however cleanly they drained; here SIGTERM
  is forwarded to the workers instead, torchrun waits for them as for any exit, and a worker that
  drained everything makes the container exit 0.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun

# torchrun handles the rest; SIGTERM is ours to forward.
SIGNALS_FOR_TORCHRUN = "SIGINT,SIGHUP,SIGQUIT"
FORWARD_EVERY_S = 1.0


def children(parent: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


class SigtermForwarder:
    """Once SIGTERM arrives, every worker gets it, including one that starts afterwards."""

    def __init__(self) -> None:
        self.received = threading.Event()
        self.signalled: set[int] = set()

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        if not self.received.is_set():
            self.received.set()
            threading.Thread(target=self._forward, daemon=True, name="sigterm-forwarder").start()

    def _forward(self) -> None:
        while True:
            for pid in children(os.getpid()):
                if pid not in self.signalled:
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except ProcessLookupError:
                        continue
                    self.signalled.add(pid)
            time.sleep(FORWARD_EVERY_S)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    SigtermForwarder().install()
    try:
        torchrun([f"--signals-to-handle={SIGNALS_FOR_TORCHRUN}", *args])
    except ChildFailedError as error:
        _, failure = error.get_first_failure()
        code = int(failure.exitcode)
        if code < 0:
            return 128 - code
        return code or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
