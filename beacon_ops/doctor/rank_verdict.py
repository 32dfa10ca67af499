"""Which rank stopped a distributed run, from every rank's last progress document and stack dump
(`beacon.contract.rank_evidence`): the rank, where it runs, its step and phase, its stack, and what the others wait in.

Pure: it reads what it is given. The doctor gives it the run's ranks evidence (from the volume, or as
rank 0 uploaded it to S3); the alarm's notification function gives it the same.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field

from beacon.contract import FinalState, Phase
from beacon.contract.pace import SLOW_RANK_SHARE, Straggler, straggler_of
from beacon.contract.rank_evidence import STALL_DUMP, RankProgress

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
DUMPED_AT = re.compile(r"^--- rank \d+ pid \d+ at (?P<at>[0-9.]+),", re.MULTILINE)
# `beacon.evidence.ranks`' stall dump: "--- rank 3 pid 1 at 1.0, step 50: no progress for 95 s after step 50"
STALL_HEADER = re.compile(rf"step (?P<step>-?\d+): {STALL_DUMP} ")


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


def dumped_step(dump: str) -> int | None:
    """The step the last dump of a stacks file was taken at, as a stall dump's header says; None for a dump that says
    none (at a signal, faulthandler's watchdog)."""
    match = STALL_HEADER.search(dump.split("\n--- rank ")[-1].split("\n", 1)[0])
    return int(match["step"]) if match else None


def dumped_at(dump: str) -> float:
    """When the last dump of a stacks file was written (wall time); 0 when it says nothing."""
    times = [float(match["at"]) for match in DUMPED_AT.finditer(dump)]
    return times[-1] if times else 0.0


# Where a rank waits for its peers though no collective frame shows: the collectives run in C++ from hooks.
# (path part of a torch frame, its functions or () for any, how the verdict names the wait)
HIDDEN_COLLECTIVES = (("torch/nn/parallel/distributed.py", (), "DDP's forward sync"),)
# FSDP's hooks gather the parameters before forward and reduce-scatter the gradients after backward: named by the
# collective its frames show
FSDP = ("torch/distributed/fsdp/", "torch/distributed/_composable/fsdp/")
FSDP_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
# DDP's reducer all-reduces each gradient bucket from autograd's hooks, in C++: a rank inside backward waits there
# only where its flight recorder holds a collective in flight; else backward is the rank's own work (a model of its
# own, a custom autograd function that blocks).
BACKWARD = ("torch/autograd/", ("_engine_run_backward", "run_backward", "backward"))
DDP_BACKWARD = "DDP's gradient all_reduce"
DATA_LOADER = "torch/utils/data/"  # a rank waiting here waits for its own data, not for a peer


def in_standard_library(frame: Frame) -> bool:
    """Python's own modules (queue, threading, selectors), wherever the interpreter lives."""
    return ("/lib/python3" in frame.file and "-packages/" not in frame.file) or frame.file.startswith("<frozen")


def torch_frames(frames: list[Frame]) -> list[Frame]:
    """The innermost frames inside torch (below any of the standard library's: a queue's wait), up to its caller."""
    inside: list[Frame] = []
    for frame in frames:
        if in_standard_library(frame) and not inside:
            continue
        if "/torch/" not in frame.file:
            break
        inside.append(frame)
    return inside


def collective_of(frames: list[Frame], *, ddp: bool = False) -> str | None:
    """What the main thread waits for its peers in: a torch.distributed collective, or one that runs hidden from
    Python (FSDP's hooks; DDP's backward, where `ddp`: the rank's flight recorder holds a collective in flight);
    None when it is elsewhere (the team's code, its DataLoader, a backward of its own)."""
    inner = torch_frames(frames)
    if any(part in f.file for f in inner for part in FSDP):
        kind = next((k for f in inner for k in FSDP_COLLECTIVES if k in f.function), "")
        return f"FSDP's {kind}" if kind else "FSDP's collectives"
    for frame in frames:
        if "torch/distributed" in frame.file and frame.function in COLLECTIVES:
            return frame.function
    for part, functions, name in (*HIDDEN_COLLECTIVES, *([(*BACKWARD, DDP_BACKWARD)] if ddp else [])):
        if any(part in f.file and (not functions or f.function in functions) for f in inner):
            return name
    return None


def in_data_loader(frames: list[Frame]) -> bool:
    return any(DATA_LOADER in f.file for f in torch_frames(frames))


def user_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame outside the interpreter, torch and Beacon: where the team's code is."""
    for frame in frames:
        if not in_standard_library(frame) and not any(part in frame.file for part in ("/torch/", "/beacon/")):
            return frame
    return frames[0] if frames else None


@dataclass(frozen=True)
class RankVerdict:
    rank: int
    # "hung" (alive, not in a collective), "died" (no last word), "failed" (its last word says so), "silent"
    # (no word since the others began to wait: frozen, killed or lost; or no document at all, `missing`)
    how: str
    step: int  # the last step its document says it finished
    phase: str
    pod: str
    node: str
    instance: str
    where: str  # the stopped rank's innermost frame of the team's code, when its stack is known
    stack: list[str] = field(default_factory=list)  # its main thread, innermost first
    waiting: dict[str, list[int]] = field(default_factory=dict)  # collective -> ranks waiting in it
    ended: str = ""
    missing: list[int] = field(default_factory=list)  # ranks with no document in the evidence

    @property
    def step_named(self) -> int:
        """The step the verdict names. A rank hung in training is inside the step after the last it finished (its
        stack shows it in the loop, its document at the step before); a checkpoint or an evaluation runs after the
        step it finished; a rank that died, failed or went silent is named at its last word's step."""
        return self.step + 1 if self.how == "hung" and self.phase == Phase.TRAINING else self.step

    def line(self) -> str:
        place = ", ".join(
            f"{k} {v}" for k, v in (("pod", self.pod), ("node", self.node), ("instance type", self.instance)) if v
        )
        how = "went silent" if self.how == "silent" else self.how
        text = f"rank {self.rank}{f' on {place}' if place else ''} {how} at step {self.step_named} in {self.phase}"
        if self.missing:  # node-local ranks directories (SageMaker): their node's leader uploaded nothing
            text = (
                f"rank(s) {rank_list(self.missing)} sent nothing while the others waited (no document: their "
                "node stopped or was lost, or is in a phase no other node sees)"
            )
        if self.where:
            text += f" ({self.where})"
        if self.ended:
            text += f", last word: {self.ended}"
        for collective, ranks in sorted(self.waiting.items()):
            if len(ranks) == 1:
                text += f"; rank {ranks[0]} waits in {collective}"
            else:
                text += f"; {len(ranks)} rank(s) wait in {collective} ({rank_list(ranks)})"
        return text


def stall_dumps(dump: str) -> list[tuple[int, str]]:
    """Each stall's section of a stacks file (its step, its text), oldest first; a SIGTERM's are left out."""
    found = []
    for section in dump.split("--- rank ")[1:]:
        header = section.split("\n", 1)[0]
        if (match := STALL_HEADER.search(header)) is not None:
            found.append((int(match["step"]), "--- rank " + section))
    return found


def _the_only_rank(ranks: list[RankProgress], stacks: dict[int, str]) -> RankVerdict | None:
    """A run of one rank: no other to compare with, but a stall's stack dump says where it hangs, while its
    document is still at that stall's step (the stacks file keeps earlier attempts' and passing stalls' dumps)
    and it did not end on its own (finished, or failed: the failure is the cause)."""
    if not ranks or ranks[0].ended.startswith((FinalState.FINISHED, FinalState.FAILED)):
        return None
    only = ranks[0]
    stalls = stall_dumps(stacks.get(only.rank, ""))
    if not stalls or stalls[-1][0] != only.step:
        return None
    frames = main_thread_of(stalls[-1][1])
    where = user_frame(frames)
    return RankVerdict(
        rank=only.rank, how="hung", step=only.step, phase=only.phase, pod=only.pod, node=only.node,
        instance=only.instance, where=str(where) if where else "", stack=[str(f) for f in frames], ended=only.ended,
    )  # fmt: skip


def rank_list(ranks: list[int]) -> str:
    """Ranks for a verdict's line: all of them up to 8, else the first and last."""
    return ", ".join(str(r) for r in ranks) if len(ranks) <= 8 else f"{ranks[0]}..{ranks[-1]}"


def which_rank(
    ranks: list[RankProgress],
    stacks: dict[int, str],
    *,
    not_joined: list[int] | None = None,
    in_flight: Collection[int] = (),
) -> RankVerdict | None:
    """The rank that stopped the run, or None when no rank stands out (every one progressing). `not_joined`: the
    ranks the flight recorders say never issued the first collective the others joined; `in_flight`: the ranks
    whose own flight recorder holds a collective they issued that has not completed."""
    if len(ranks) < 2 and max((r.world_size for r in ranks), default=1) < 2:
        return _the_only_rank(ranks, stacks)
    newest = max(r.wall_time for r in ranks)
    main = {r.rank: main_thread_of(stacks.get(r.rank, "")) for r in ranks}
    for rank in ranks:  # a dump of an earlier stop (a slow step, stepped past since) says nothing of where it is now
        if (step := dumped_step(stacks.get(rank.rank, ""))) is not None and step < rank.step:
            main[rank.rank] = []
    waiting: dict[str, list[int]] = defaultdict(list)
    for rank in ranks:
        if (collective := collective_of(main[rank.rank], ddp=rank.rank in in_flight)) is not None:
            waiting[collective].append(rank.rank)
    # No last word, while the others ended or went on writing long after: killed outright, or frozen.
    others_ended = any(r.ended for r in ranks)
    dead = [r for r in ranks if not r.ended and (others_ended or newest - r.wall_time > STALE_AFTER_S)]
    failed = [r for r in ranks if r.ended.startswith("failed")]
    in_collective = {rank for group in waiting.values() for rank in group}
    # A rank in a named phase (a 150 s checkpoint or evaluation) is working, not hung, while the others wait;
    # past its phase limit it is hung in that phase.
    hung = [
        r
        for r in ranks
        if r.rank not in in_collective and r.rank in stacks and main[r.rank] and not r.working_in_phase(newest)
    ]
    # The flight recorders name who did not join: among the hung, that one; and a rank outside every collective
    # that never joined is hung there even when no other rank's stack shows the collective (a C++ wait)
    if not_joined:
        hung = [r for r in hung if r.rank in not_joined] or hung
        if not in_collective and hung:
            in_collective = {r.rank for r in ranks if r.rank not in not_joined}
    # What each rank that dumped its stacks waits in: its collective, else its innermost frame (DDP's
    # gradient all-reduce runs in C++ inside backward: no collective frame shows).
    dumped = {r.rank for r in ranks if main[r.rank]}
    blocked: dict[str, list[int]] = defaultdict(list)
    for number in sorted(dumped):
        blocked[collective_of(main[number], ddp=number in in_flight) or main[number][0].function].append(number)
    # No dump and no last word, its document written before any other rank dumped (an alive rank rewrites
    # it each pass, and dumps at the same stall): its own threads stopped (SIGSTOP, a lost node, killed)
    # while every other rank stalled, dumped and still waits. However old its document grows, that is all
    # the evidence says; "died" needs more: the others ended (torchrun tore the job down) or never dumped.
    # (a dump at the signal says no time: it does not count)
    first_dump = min((at for number in dumped if (at := dumped_at(stacks[number])) > 0), default=0.0)
    silent = [r for r in ranks if not r.ended and r.rank not in dumped and r.wall_time < first_dump]
    went_silent = bool(silent) and not others_ended and len(dumped) + len(silent) == len(ranks)
    world = max((r.world_size for r in ranks), default=0)
    missing = sorted(set(range(world)) - {r.rank for r in ranks})
    if went_silent:
        stopped, how = min(silent, key=lambda r: (r.wall_time, r.rank)), "silent"
        waiting = blocked
    elif dead:
        stopped, how = min(dead, key=lambda r: r.wall_time), "died"
    elif hung and in_collective:
        stopped, how = min(hung, key=lambda r: (r.step, r.rank)), "hung"
    elif failed and len(failed) < len(ranks):
        stopped, how = min(failed, key=lambda r: r.wall_time), "failed"
    elif missing and dumped == {r.rank for r in ranks}:
        # Node-local directories: every rank whose evidence arrived stalled and waits; the missing ones sent none.
        return RankVerdict(
            rank=missing[0], how="silent", step=-1, phase="", pod="", node="", instance="", where="",
            waiting={k: sorted(v) for k, v in blocked.items()}, missing=missing,
        )  # fmt: skip
    else:
        return None
    frames = main[stopped.rank]
    where = user_frame(frames)
    place = str(where) if where else ""
    if place and in_data_loader(frames):
        place += ", waiting for its DataLoader"
    return RankVerdict(
        rank=stopped.rank,
        how=how,
        step=stopped.step,
        phase=stopped.phase,
        pod=stopped.pod,
        node=stopped.node,
        instance=stopped.instance,
        where=place,
        stack=[str(f) for f in frames],
        waiting={k: sorted(v) for k, v in waiting.items() if stopped.rank not in v},
        ended=stopped.ended,
    )


@dataclass(frozen=True)
class SlowRank:
    """The rank the others wait for, as far as its document places it (`contract.pace.Straggler`)."""

    straggler: Straggler
    pod: str
    node: str
    instance: str
    step_s: float  # the run's median step interval over the window

    def line(self) -> str:
        s = self.straggler
        where = (("pod", self.pod), ("node", self.node), ("instance type", self.instance))
        place = ", ".join(f"{k} {v}" for k, v in where if v)
        return (
            f"rank {s.rank}{f' on {place}' if place else ''} is slow: the other ranks wait for it "
            f"{s.waited_share:.0%} of each {self.step_s:.2f} s step, its own work {s.step_ratio:.2f}x theirs, "
            f"over its last {s.window_s:.0f} s ({s.steps} steps)"
        )


def slow_rank(ranks: list[RankProgress], *, share: float = SLOW_RANK_SHARE) -> SlowRank | None:
    """The straggler of a run whose ranks time their collectives (`run.watch`), when it is slow for the verdict;
    None otherwise. Every rank's step interval is the same: the rank is named by what it does not wait for."""
    live = [r for r in ranks if not r.ended]
    straggler = straggler_of([r.pace for r in live])
    if straggler is None or not straggler.is_slow(share=share):
        return None
    document = next(r for r in live if r.rank == straggler.rank)
    return SlowRank(straggler, document.pod, document.node, document.instance, document.pace_step_s)
