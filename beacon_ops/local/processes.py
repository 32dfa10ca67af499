"""End a job's whole process tree, across the sessions torchrun puts its workers in.

torchrun starts each worker in a new session, and a DataLoader worker belongs to its rank, so a
signal to the launcher's process group leaves the ranks and their workers running as orphans. The
tree is read from /proc, frozen so nothing forks or reparents in between, then killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

SETTLE_S = 5.0


def parent_of(pid: int) -> int | None:
    try:
        fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1])


def descendants(root: int) -> list[int]:
    """Every living process below `root`, parents before children."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            parent = parent_of(int(entry.name))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, []):
            found.append(child)
            frontier.append(child)
    return found


def end_process_tree(root: int, *, timeout: float = SETTLE_S) -> None:
    """SIGKILL `root` and everything below it; returns once none of them is left (or `timeout`)."""
    tree: list[int] = [root]
    while True:  # freeze until no new process appears: a frozen parent cannot fork
        for pid in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        grown = [pid for pid in descendants(root) if pid not in tree]
        if not grown:
            break
        tree.extend(grown)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    for pid in tree:
        while time.monotonic() < deadline and _alive(pid):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stop_process(process: subprocess.Popen[Any], *, grace_s: float = 10) -> None:
    """SIGTERM, and SIGKILL if it has not ended within grace_s: a child of ours never outlives us."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
