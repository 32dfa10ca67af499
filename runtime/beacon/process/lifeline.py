"""A process that cannot outlive the one that started it.

A SIGKILLed launcher (an OOM kill, a runner's timeout) leaves its ranks and their DataLoader workers
orphaned, holding the GPU, the spool and the run's S3 prefix. Linux's PR_SET_PDEATHSIG signals a
process when its parent dies; a rank drains on SIGTERM, a DataLoader worker simply ends.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(signum: signal.Signals, *, parent: int | None = None) -> bool:
    """Ask for `signum` when the parent dies; signal ourselves at once if it already has. False where
    the platform has no such request."""
    if not sys.platform.startswith("linux"):
        return False
    expected = os.getppid() if parent is None else parent
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != expected:  # the parent died before the request was in place
        os.kill(os.getpid(), signum)
    return True


def dataloader_worker_dies_with_its_rank(_worker_id: int) -> None:
    """A DataLoader `worker_init_fn`: a spawned worker ends with the rank that started it."""
    die_with_parent(signal.SIGKILL)
