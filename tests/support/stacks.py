"""A rank's stall dump as faulthandler writes it, for tests of the readers that name where a rank waits."""

from __future__ import annotations


def stall_dump(rank: int, *main_frames: str, line: int = 1, step: int = 7, stalled_s: int = 95) -> str:
    """A stacks file: the rank's header, a helper thread, then the main thread (`file:function`, innermost first)."""
    frames = "\n".join(
        f'  File "{file}", line {line} in {function}' for file, function in (f.split(":") for f in main_frames)
    )
    return (
        f"--- rank {rank} pid 1 at 1.0, step {step}: no progress for {stalled_s} s after step {step}\n"
        "Thread 0x1 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 331 in wait\n'
        '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n\n'
        f"Current thread 0x2 (most recent call first):\n{frames}\n"
        '  File "<frozen runpy>", line 198 in _run_module_as_main\n'
    )
