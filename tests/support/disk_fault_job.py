"""`python -m tests.support.disk_fault_job CALL N JOB-ARGS...`: the real training job, whose N-th
`os.write` or `os.fsync` (CALL) on the spool's open chunk fails once with EIO.

The fault lands exactly where a failing volume hurts: between a record taken from the loop and its
fsync. A failed write has written half its bytes first, as a torn write does.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

from beacon.log.spool import OPEN
from smoke_job.train import main

CALLS = ("write", "fsync")


def on_open_chunk(descriptor: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{descriptor}").endswith(f"/{OPEN}")
    except OSError:
        return False


class EioOnOpenChunk:
    """A stand-in for `os.<call>` whose nth call on the spool's open chunk fails with EIO, once (or
    every call from the nth on, when `persistent`); every other call is the real one."""

    def __init__(self, call: str, nth: int, *, persistent: bool = False) -> None:
        if call not in CALLS:
            raise SystemExit(f"unknown call {call!r}; one of {', '.join(CALLS)}")
        self.call, self.nth, self.persistent = call, nth, persistent
        self.real: Any = getattr(os, call)
        self.calls = 0
        self.injected = 0

    def __call__(self, descriptor: int, *args: Any) -> Any:
        if on_open_chunk(descriptor):
            self.calls += 1
            if self.calls == self.nth or (self.persistent and self.calls > self.nth):
                if self.call == "write":
                    data = memoryview(args[0])
                    self.real(descriptor, data[: len(data) // 2])  # torn: half the bytes reached the file
                self.injected += 1
                print(f"beacon-test: EIO injected into os.{self.call}", file=sys.stderr)
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        return self.real(descriptor, *args)


if __name__ == "__main__":
    setattr(os, sys.argv[1], EioOnOpenChunk(sys.argv[1], int(sys.argv[2])))
    sys.exit(main(sys.argv[3:]))
