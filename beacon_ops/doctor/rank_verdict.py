"""Which rank stopped a distributed run, from every rank's last progress document and stack dump
(`beacon.ranks`): the rank, where it runs, its step and phase, its stack, and what the others wait in.

Pure: it reads what it is given. The doctor gives it the run's ranks evidence (from the volume, or as
rank 0 uploaded it to S3); the alarm's notification function gives it the same.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from beacon.contract import Phase
from beacon.ranks import RankProgress

# A rank whose document is this much older than the newest one stopped writing it: dead or frozen.
STALE_AFTER_S = 30.0
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "all_to_all",
    "send",
    "recv",
    "reduce",
    "gather",
    "scatter",
)
FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')
SECTION = re.compile(r"^--- rank (?P<rank>\d+) .*?: (?P<reason>.*)$")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


def main_thread_of(dump: str) -> list[Frame]:
    """The main thread's frames (innermost first) in the last dump of a stacks file: the thread
    whose outermost frame is not a `threading` bootstrap."""
    sections = dump.split("\n--- rank ")
    last = sections[-1]
    threads: list[list[Frame]] = []
    for line in last.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            threads.append([])
        elif threads and (match := FRAME.match(line)):
            threads[-1].append(Frame(match["file"], int(match["line"]), match["function"]))
    for frames in threads:
        if frames and frames[-1].function != "_bootstrap":
            return frames
    return []


def collective_of(frames: list[Frame]) -> str | None:
    """The collective the main thread waits in, if its innermost torch.distributed frame is one."""
    for frame in frames:
        if "torch/distributed" in frame.file and frame.function in COLLECTIVES:
            return frame.function
    return None


def user_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame outside the interpreter, torch and Beacon: where the team's code is."""
    for frame in frames:
        if not any(part in frame.file for part in ("/threading.py", "/torch/", "/beacon/", "<frozen")):
            return frame
    return frames[0] if frames else None


@dataclass(frozen=True)
class RankVerdict:
    rank: int
    how: str  # "hung" (alive, not in a collective), "died" (no last word), "failed" (its last word says so)
    step: int
    phase: str
    pod: str
    node: str
    instance: str
    where: str  # the stopped rank's innermost frame of the team's code, when its stack is known
    stack: list[str] = field(default_factory=list)  # its main thread, innermost first
    waiting: dict[str, list[int]] = field(default_factory=dict)  # collective -> ranks waiting in it
    ended: str = ""

    def line(self) -> str:
        place = ", ".join(
            f"{k} {v}" for k, v in (("pod", self.pod), ("node", self.node), ("instance", self.instance)) if v
        )
        text = f"rank {self.rank}{f' on {place}' if place else ''} {self.how} at step {self.step} in {self.phase}"
        if self.where:
            text += f" ({self.where})"
        if self.ended:
            text += f", last word: {self.ended}"
        for collective, ranks in sorted(self.waiting.items()):
            text += f"; {len(ranks)} rank(s) wait in {collective} ({rank_list(ranks)})"
        return text


def rank_list(ranks: list[int]) -> str:
    """Ranks for a verdict's line: all of them up to 8, else the first and last."""
    return ", ".join(str(r) for r in ranks) if len(ranks) <= 8 else f"{ranks[0]}..{ranks[-1]}"


def which_rank(ranks: list[RankProgress], stacks: dict[int, str]) -> RankVerdict | None:
    """The rank that stopped the run, or None when no rank stands out (every one progressing)."""
    if len(ranks) < 2:
        return None
    newest = max(r.wall_time for r in ranks)
    main = {r.rank: main_thread_of(stacks.get(r.rank, "")) for r in ranks}
    waiting: dict[str, list[int]] = defaultdict(list)
    for rank in ranks:
        if (collective := collective_of(main[rank.rank])) is not None:
            waiting[collective].append(rank.rank)
    # No last word, while the others ended or went on writing long after: killed outright, or frozen.
    others_ended = any(r.ended for r in ranks)
    dead = [r for r in ranks if not r.ended and (others_ended or newest - r.wall_time > STALE_AFTER_S)]
    failed = [r for r in ranks if r.ended.startswith("failed")]
    in_collective = {rank for group in waiting.values() for rank in group}
    # A rank in a named phase (a 150 s checkpoint or evaluation) is working, not hung, while the others wait.
    hung = [
        r
        for r in ranks
        if r.rank not in in_collective and r.rank in stacks and main[r.rank] and r.phase == Phase.TRAINING
    ]
    if dead:
        stopped, how = min(dead, key=lambda r: r.wall_time), "died"
    elif hung and in_collective:
        stopped, how = min(hung, key=lambda r: (r.step, r.rank)), "hung"
    elif failed and len(failed) < len(ranks):
        stopped, how = min(failed, key=lambda r: r.wall_time), "failed"
    else:
        return None
    frames = main[stopped.rank]
    where = user_frame(frames)
    return RankVerdict(
        rank=stopped.rank,
        how=how,
        step=stopped.step,
        phase=stopped.phase,
        pod=stopped.pod,
        node=stopped.node,
        instance=stopped.instance,
        where=str(where) if where else "",
        stack=[str(f) for f in frames],
        waiting={k: sorted(v) for k, v in waiting.items() if stopped.rank not in v},
        ended=stopped.ended,
    )
