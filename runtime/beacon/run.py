"""`beacon.init` and the `Run` it returns: what a team's own training loop calls.

    run = beacon.init("resnet")            # preflight, resume point, sinks; a no-op sink off rank 0
    for step in range(run.resume_step, steps):
        ...
        run.log({"loss": loss, "lr": lr}, step)   # a queue append: tensors are read off this thread
        if run.should_stop(): break               # SIGTERM on any rank: every rank stops together
    run.finish()                                  # bounded drain; the final state says how it ended

Frameworks that save their own checkpoints hand them over with `run.commit_checkpoint`; their
integrations (`beacon.integrations`) also use `run.mark_step` and `run.log_hyperparams`.

Only rank 0 writes (records, TensorBoard, CloudWatch, the final state); every rank touches its own
liveness file and loads the resume checkpoint. Each other node's local rank 0 uploads its node's rank
evidence when rank 0 cannot (`beacon.evidence.node_leader`).
"""

from __future__ import annotations

import json
import logging
import operator
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import Any

import torch
import torch.distributed as dist
from botocore.exceptions import BotoCoreError, ClientError

from beacon import aws, contract
from beacon.checkpoint import (
    AsyncCheckpointer,
    Uploader,
    checkpoint_name,
    framework_checkpoint,
    load_resume_point,
)
from beacon.contract import FinalState, Phase
from beacon.contract.rank_evidence import FLIGHT_RECORDER_ENTRIES, FLIGHT_RECORDER_PREFIX
from beacon.evidence.node_leader import NodeLeader, leads_evidence
from beacon.evidence.progress import ProgressClock
from beacon.evidence.ranks import RankSignal, rank_signal_interval
from beacon.evidence.step_pace import TimedCollectives, watch_ddp
from beacon.log.reconcile import RunConflictError, reconcile
from beacon.log.spool import Spool
from beacon.log.spool_owner import SpoolOwnedError, SpoolOwner
from beacon.process import error_file
from beacon.process.distributed import World, world_from_environment
from beacon.process.lifeline import die_with_parent
from beacon.process.liveness import Liveness
from beacon.process.preflight import PreflightError, run_preflight
from beacon.settings import RunSettings, SettingsError, generated_run_id
from beacon.sinks.mirrors import MIRROR_SHARE, RunInfo, build
from beacon.sinks.mirrors.worker import MIRRORS_DIR, MirrorReport, Mirrors, MirrorWorker, s3_chunks
from beacon.sinks.run_alarms import RunAlarms
from beacon.telemetry import DeliveryReport, Flushed, NullTelemetry, Telemetry, TelemetrySink

log = logging.getLogger("beacon.run")
RESUME_MODES = ("auto", "never")
# Beyond rank 0's drain budget: its final checkpoint and last uploads, before the group is torn down.
FINISH_MARGIN_S = 30.0
# The least the tracker mirrors get once the uploads are over, to send the last records and the state.
MIRROR_LAST_WORD_S = 1.0
PHASE_NAME_LIMIT = 64
NUMBER_KINDS = frozenset((float, int))  # what `run.log` takes without a closer look


@dataclass
class FinishReport:
    """What `Run.finish` did; `state` is what the run's final-state record says."""

    state: FinalState
    error: str | None
    last_step: int
    delivery: DeliveryReport
    checkpoints: list[int] = field(default_factory=list)
    checkpoints_skipped: list[int] = field(default_factory=list)  # the previous one was still being written
    checkpoint_abandoned: bool = False
    aws_requests: dict[str, int] = field(default_factory=dict)  # by service, sent by this process
    mirrors: dict[str, MirrorReport] = field(default_factory=dict)  # by tracker

    @property
    def delivered(self) -> bool:
        """Every logged value is in S3: no record waits in the queue, the spool thread's hands or the spool, the spool
        thread finished, and no value was set aside."""
        delivery = self.delivery
        return delivery.unacknowledged_records == 0 and not delivery.values_set_aside and not delivery.spool_unfinished


def logged_step(step: object, call: str) -> int:
    """A step that is not a plain int (a numpy integer) as one; anything else (None, a string, a float, a bool, a
    tensor, whose value would be read here) refused in one line naming it: on the spool thread it would cost the
    steps drained beside it."""
    if isinstance(step, bool | torch.Tensor) or not hasattr(step, "__index__"):
        raise TypeError(
            f"{call}: step {step!r} is {type(step).__name__}, not an int; nothing of this call was recorded"
        )
    return operator.index(step)


class Run:
    """One training run as Beacon sees it. Made by `init`; used from the training thread.

    Besides its methods, public: `world` (rank, local rank, size, device), `resume_step`, `attempt`,
    `is_writer`, and `stop`, the event SIGTERM or SIGINT sets (`run.stop.wait(s)` is a sleep a stop ends;
    `should_stop()` asks every rank)."""

    def __init__(
        self,
        *,
        settings: RunSettings,
        world: World,
        progress: ProgressClock,
        telemetry: TelemetrySink,
        checkpointer: AsyncCheckpointer | None,
        resume_limit: int | None,
        liveness: Liveness,
        stop: threading.Event,
        mirrors: Mirrors | None = None,
    ) -> None:
        self.settings = settings
        self.world = world
        self.progress = progress
        self.telemetry = telemetry
        self.checkpointer = checkpointer
        # The last step whose record is durable (spool or S3) on rank 0: no rank resumes past it. None: telemetry
        # off, nothing known. The one resume point: `resumed_after_step` is this, said as a step.
        self.resume_limit = resume_limit
        self.liveness = liveness
        self.stop = stop
        self.mirrors = mirrors  # rank 0's tracker mirrors, when settings.mirrors names any
        self.last_step = -1
        self._resume_state: dict[str, Any] | None = None
        self.resume_step = 0
        # This process's attempt of the run (rank 0 counts them; 0 elsewhere): 0, then one more per restart.
        self.attempt = 0
        # The framework's own checkpoint to resume from (`commit_checkpoint`'s path), as given.
        self.resume_checkpoint: str | None = None
        self._in_setup = True
        self._marked_step: int | None = None
        self._hyperparams_sent: bytes | None = None
        self._hyperparams_writes: list[threading.Thread] = []
        self._known_metrics: set[str] = set()
        self._signals: StopSignals | None = None
        self._early_signal: str | None = None
        self._owned_world: Any = None  # the context that made the process group, if init made it
        self.finished: FinishReport | None = None
        self.rank_signal: RankSignal | None = None  # this rank's progress signal and stack dumps
        self.node_leader: NodeLeader | None = None  # a node's local rank 0, or node 0's local rank 1: evidence
        self._timed_collectives: TimedCollectives | None = None

    # --- identity ---------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.settings.run

    @property
    def experiment(self) -> str:
        return self.settings.experiment

    @property
    def is_writer(self) -> bool:
        return self.world.is_writer

    # --- the training thread's calls --------------------------------------------------------------
    @property
    def resumed_after_step(self) -> int:
        """The last step this run held records of when it started (-1: none, or telemetry off), on every rank."""
        return -1 if self.resume_limit is None else self.resume_limit

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record `metrics` for `step` (an int): numbers or one-element tensors, NaN kept as NaN. Costs a queue
        append; a tensor's value is read on Beacon's spool thread, not here (unless the spool is 250,000 values
        behind: then here, docs/runtime/loop.md). Anything else (a string, None, a tensor of several elements; a
        step that is not an int) is refused here with a TypeError naming the metric or the step, and the call
        records nothing."""
        if type(step) is not int:
            step = logged_step(step, "run.log")
        if self._in_setup:
            self._in_setup = False
            self.progress.leave(Phase.SETUP)
        if not metrics.keys() <= self._known_metrics:
            for name in metrics:
                if not contract.is_metric_name(name):
                    raise ValueError(f"run.log: metric name {name!r} must match {contract.METRIC_NAME_PATTERN.pattern}")
            self._known_metrics.update(metrics)
        if not set(map(type, metrics.values())) <= NUMBER_KINDS:  # floats and ints checked in C: the loop's cost
            for name, value in metrics.items():
                if type(value) is torch.Tensor and value.numel() == 1 and not value.is_complex():
                    continue  # a one-element tensor: read on the spool thread
                if problem := contract.unloggable(value):
                    raise TypeError(f"run.log: metric {name!r} at step {step} is {problem}, not a number or a "
                                    "one-element tensor; nothing of this call was recorded")  # fmt: skip
        self.mark_step(step)
        self.last_step = step
        self.telemetry.log(step, metrics)

    def flush(self, timeout: float = 30.0) -> Flushed:
        """Wait, at most `timeout` seconds, until every step logged so far is durable in the spool and in S3 (its
        chunk sealed now, not at the next flush interval); say what is durable where. Before an evaluation that
        reads the run back, or a hand-over. On a rank other than 0, or with telemetry off, there is nothing to
        wait for. Never needed for safety: `finish` drains, and a kill loses nothing the spool has fsync'd."""
        return self.telemetry.flush(timeout)

    def mark_step(self, step: int) -> None:
        """`step` finished, whether or not it has metrics: the stall clock restarts. A framework logs
        every few steps; its integration marks every one, so a long log interval is not a stall."""
        if type(step) is not int:
            step = logged_step(step, "run.mark_step")
        if self._in_setup:
            self._in_setup = False
            self.progress.leave(Phase.SETUP)
        if step != self._marked_step:  # once per step, so steps/s counts steps, not calls
            self._marked_step = step
            self.progress.dispatched_step = step
            self.progress.step_finished()

    def watch(self, model: Any = None, *, hook: Callable[..., Any] | None = None, state: Any = None) -> None:
        """Time each step's waits for its peers on this rank, so the rank the others wait for is named (a straggler:
        every rank's step interval is the slowest's, docs/runtime/ranks.md). `model`, a DistributedDataParallel: its
        last gradient bucket's all_reduce, through a communication hook around `hook` (the one the team would
        register itself, with `state`; the default all_reduce over the model's group when None). And the
        synchronous collectives the loop calls through `torch.distributed` (`dist.all_reduce`), until `finish`. Once
        per run, before the first step; stores a few numbers a step."""
        if model is not None:
            from torch.nn.parallel import DistributedDataParallel

            model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper around the DDP module
            if not isinstance(model, DistributedDataParallel):  # FSDP has a comm hook too, called otherwise
                raise TypeError(f"run.watch: model is {type(model).__name__}, not a DistributedDataParallel")
            watch_ddp(model, self.progress.pace, hook=hook, state=state)
        if self._timed_collectives is None:
            self._timed_collectives = TimedCollectives(self.progress.pace).install()

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Keep the run's hyperparameters beside its records: rank 0 writes them once, create-only
        (`contract.hyperparams_key`), on a thread of its own. A restarted run with the same values
        finds them there; other values are refused (the first attempt's stay) and logged."""
        if not self.is_writer:
            return
        document = contract.hyperparams_document(params)
        if document == self._hyperparams_sent:
            return
        self._hyperparams_sent = document
        write = threading.Thread(
            target=self.telemetry.publish_hyperparams, args=(document,), name="beacon-hyperparams", daemon=True
        )
        self._hyperparams_writes.append(write)
        write.start()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time spent inside is work, not a stall (evaluation, a checkpoint, setup): it is kept out of
        the stall clock and sent as PhaseSeconds with a Phase dimension while it lasts."""
        if not (0 < len(name) <= PHASE_NAME_LIMIT and contract.is_id(name)):
            raise ValueError(f"run.phase: name {name!r} must be 1-{PHASE_NAME_LIMIT} of a-z, 0-9 and '-'")
        with self.progress.phase(name):
            yield

    def should_stop(self) -> bool:
        """True on every rank once any rank was asked to stop (SIGTERM, SIGINT): a collective, so call
        it at the same point of every step on every rank. Once `watch` was called, its wait for the other ranks counts
        in this rank's pace (the first collective of a step is where a slow rank is waited for)."""
        with self.progress.pace.waiting():
            return self.world.any_rank(self.stop.is_set())

    def checkpoint(self, state: dict[str, Any], step: int) -> bool:
        """Save `state` in the background (rank 0; the snapshot is the only work on this thread).
        `latest` moves only once the file is written and every record through `step` is durable.
        False when the previous checkpoint is still being written (this one is skipped)."""
        if self.checkpointer is None:
            return False
        with self.progress.phase(Phase.CHECKPOINT):
            started = self.checkpointer.save(step, {**state, "step": step})
        if not started:
            self.telemetry.checkpoint_skipped(step, self.checkpointer.resume_point)
        return started

    def commit_checkpoint(self, step: int, future: Any = None, *, path: str | os.PathLike[str] | None = None) -> bool:
        """Make a checkpoint the framework wrote itself the resume point: HF Trainer's save (`future`
        None: written already) or `torch.distributed.checkpoint.async_save` (its future). `latest`
        moves to it once the future finished and every record through `step` is durable; a failed
        save leaves `latest` where it was. Waits on a thread of its own, so this returns at once.
        A resumed run finds `path` in `run.resume_checkpoint`. Rank 0 only: False elsewhere."""
        if self.checkpointer is None:
            return False
        self.checkpointer.commit(step, future, None if path is None else os.fspath(path))
        return True

    def load_checkpoint(self) -> dict[str, Any] | None:
        """The state saved at `resume_step - 1`, once; None on a fresh run."""
        state, self._resume_state = self._resume_state, None
        return state

    # --- ending -----------------------------------------------------------------------------------
    def finish(
        self, status: FinalState | str | None = None, *, error: BaseException | str | None = None
    ) -> FinishReport:
        """Drain within the shutdown budget and write the final state. `status` defaults to
        `preempted` after SIGTERM/SIGINT, `failed` when `error` is given, else `finished`."""
        if self.finished is not None:
            return self.finished
        state = FinalState(status) if status is not None else self._derived_state(error)
        error_name = error if isinstance(error, str | None) else type(error).__name__
        started = time.monotonic()
        deadline = started + self.settings.shutdown_budget
        if self.mirrors is not None:
            self.mirrors.finishing(state)  # they drain beside the uploads, on their own threads
        checkpoint_done = True
        for write in self._hyperparams_writes:
            write.join(timeout=max(0.0, (deadline - time.monotonic()) / 4))
        if self.checkpointer is not None:
            self.checkpointer.loop_over(self.last_step)
            # Finish the in-flight checkpoint if the budget allows; otherwise abandon it (its temp
            # file never became `latest`, so a resume uses the previous one).
            checkpoint_done = self.checkpointer.join(timeout=max(0.0, (deadline - time.monotonic()) / 2))
        delivery = self.telemetry.close(budget=max(1.0, deadline - time.monotonic()))
        mirrors: dict[str, MirrorReport] = {}
        if self.mirrors is not None:
            share_ends = started + MIRROR_SHARE * self.settings.shutdown_budget
            mirrors = self.mirrors.join(until=min(deadline, max(share_ends, time.monotonic() + MIRROR_LAST_WORD_S)))
        report = FinishReport(
            state=state,
            error=error_name,
            last_step=self.last_step,
            delivery=delivery,
            checkpoints=sorted(self.checkpointer.saved) if self.checkpointer else [],
            checkpoints_skipped=list(self.checkpointer.skipped) if self.checkpointer else [],
            checkpoint_abandoned=not checkpoint_done,
            aws_requests=dict(aws.REQUESTS.by_service),
            mirrors=mirrors,
        )
        self.finished = report
        if not report.delivered:  # never silently: a team's own script reads its log, not the report
            delivery = report.delivery
            log.error(
                "run %s: not everything logged reached S3: %d record(s) not acknowledged%s%s; python -m beacon.sync "
                "delivers what the spool holds", self.settings.run, delivery.unacknowledged_records,
                ", the spool thread did not finish within the shutdown budget" if delivery.spool_unfinished else "",
                f", values set aside (by metric) {delivery.values_set_aside}" if delivery.values_set_aside else "",
            )  # fmt: skip
        self.telemetry.publish_final(self._final_record(report))
        if self._timed_collectives is not None:
            self._timed_collectives.remove()
        if self.rank_signal is not None:  # before the last barrier: rank 0 then uploads every rank's last word
            self.rank_signal.stop(ended=f"{state.value}: {error_name}" if error_name else state.value)
        try:
            self.world.finish_together(self.settings.shutdown_budget + FINISH_MARGIN_S)
            if self.rank_signal is not None:
                self.telemetry.publish_rank_evidence(self.settings.run_ranks_dir, self.attempt)
            if self.node_leader is not None:  # what rank 0 will not upload (`beacon.evidence.node_leader`)
                self.node_leader.finish()
        finally:
            self.liveness.stop()
            if self._signals is not None:
                self._signals.restore()
            if self._owned_world is not None:
                self._owned_world.__exit__(None, None, None)
        return report

    @property
    def stop_signal(self) -> str | None:
        """The signal that asked this run to stop, if one did."""
        return self._early_signal or (self._signals.received if self._signals is not None else None)

    def request_stop(self, signal_name: str | None = None) -> None:
        """Stop at the next `should_stop`, as SIGTERM would (a program that caught a signal itself,
        say before `import beacon`, passes it on here)."""
        self._early_signal = self._early_signal or signal_name
        self.stop.set()

    def _derived_state(self, error: BaseException | str | None) -> FinalState:
        if isinstance(error, KeyboardInterrupt) or (error is None and self.stop.is_set()):
            return FinalState.PREEMPTED
        return FinalState.FAILED if error is not None else FinalState.FINISHED

    def _final_record(self, report: FinishReport) -> dict[str, Any]:
        return {
            "state": report.state.value,
            "attempt": self.attempt,  # a later attempt supersedes it (`beacon_ops.evidence.reading`)
            "error": report.error,
            "signal": self.stop_signal,
            "run": self.settings.run,
            "experiment": self.settings.experiment,
            "world_size": self.world.size,
            "resumed_after_step": self.resumed_after_step,
            "last_step": report.last_step,
            "checkpoints": report.checkpoints,
            "checkpoints_skipped": report.checkpoints_skipped,
            "unacknowledged_records": report.delivery.unacknowledged_records,
            "values_set_aside": report.delivery.values_set_aside,  # by metric: values `float()` refused
            "spool_unfinished": report.delivery.spool_unfinished,
            "mirrors_behind": {name: mirror.behind for name, mirror in report.mirrors.items()},
            "ended_at": time.time(),
        }

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _trace: TracebackType | None
    ) -> None:
        self.finish(error=error)


class StopSignals:
    """SIGTERM (eviction, Karpenter, a stopped SageMaker job) and SIGINT: stop stepping, then drain.
    Installed from the first moment of `init`; `restore` gives the previous handlers back."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.received: str | None = None
        self.on_signal: Callable[[str], None] | None = None
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            log.warning("beacon.init outside the main thread: no SIGTERM handling (stop with run.stop.set())")
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.received = signal.Signals(signum).name
        logging.getLogger("beacon").warning("received %s: finishing the step, then draining", self.received)
        self.stop.set()
        if self.on_signal is not None:
            self.on_signal(f"received {self.received}")

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()


def init(
    experiment: str | None = None,
    run_id: str | None = None,
    resume: str = "auto",
    *,
    settings: RunSettings | None = None,
    handle_signals: bool = True,
    **overrides: Any,
) -> Run:
    """Start (or resume) a run: settings from the arguments and `BEACON_*`/`AWS_*`, ranks from
    torchrun's environment (or the process group already made by Lightning, Accelerate, ...),
    preflight on rank 0, and the resume point every rank agrees on.

    Raises `SettingsError` (a setting is unusable) or `PreflightError` (a sink is unreachable, the
    spool cannot keep records, or another job holds this run id), each one line, also written into the
    rank's torchrun error file (`beacon.process.error_file`) so torchrun's summary and `beacon.launch` show it."""
    try:
        run = _start(experiment, run_id, resume, settings, handle_signals, overrides)
    except PreflightError as error:
        error_file.record(error, exit_code=contract.EXIT_PREFLIGHT)
        raise
    except SettingsError as error:
        error_file.record(error, exit_code=contract.EXIT_BAD_INPUT)
        raise
    error_file.clear()
    return run


def _start(
    experiment: str | None,
    run_id: str | None,
    resume: str,
    settings: RunSettings | None,
    handle_signals: bool,
    overrides: dict[str, Any],
) -> Run:
    if resume not in RESUME_MODES:
        raise SettingsError(f"resume: must be one of {', '.join(RESUME_MODES)}, got {resume!r}")
    if settings is None:
        settings = RunSettings.resolve(experiment=experiment, run=run_id, **overrides)
    elif experiment is not None or run_id is not None or overrides:
        raise SettingsError("settings: pass either a RunSettings or individual settings, not both")
    owned = None
    if settings.telemetry and settings.run:
        keep_flight_recorder(settings)  # before the process group exists: torch reads it at creation
    if dist.is_available() and dist.is_initialized():
        world = World.of_current_group()
    else:
        owned = world_from_environment()
        world = owned.__enter__()
    stop = threading.Event()
    signals = StopSignals(stop) if handle_signals else None  # from the start: a SIGTERM during preflight drains too
    liveness = Liveness(settings.heartbeat_file, local_rank=world.local_rank, interval=settings.heartbeat_interval)
    rank_signal: RankSignal | None = None
    node_rank = int(os.environ.get("GROUP_RANK", "-1"))  # torchrun's number of this node
    try:
        if handle_signals and "TORCHELASTIC_RUN_ID" in os.environ:
            die_with_parent(signal.SIGTERM)  # a killed launcher: drain, rather than run on as an orphan
        liveness.start()  # every rank's own sign of life, from before setup until the drain is over
        settings = settings.with_run(world.broadcast(settings.run or generated_run_id()))
        progress = ProgressClock(phase_limit=settings.phase_limit)
        progress.enter(Phase.SETUP)  # left at the first log: a long setup is work, not a stall
        if settings.telemetry:
            rank_signal = RankSignal(
                settings.run_ranks_dir,
                rank=world.rank,
                local_rank=world.local_rank,
                world_size=world.size,
                progress=progress,
                interval=rank_signal_interval(settings.heartbeat_interval),
                stall_dump_after=settings.stall_dump_after,
                node_rank=node_rank,
            ).start()
            if signals is not None:
                signals.on_signal = rank_signal.dump_stacks  # an eviction keeps each rank's stacks
                rank_signal.dump_at_signal(signal.SIGTERM)  # and at once, in C, if the main thread is blocked in C
        run = _build(settings, world, liveness, stop, resume, progress)
        run.rank_signal = rank_signal
        leads = leads_evidence(rank=world.rank, local_rank=world.local_rank, node_rank=node_rank)
        if rank_signal is not None and leads and not world.is_writer:
            # The least AWS machinery: one S3 client, no preflight (rank 0's checked the bucket), no CloudWatch.
            run.node_leader = NodeLeader(
                aws.client("s3", settings.region), settings=settings, rank=world.rank, node_rank=node_rank,
                progress=progress,
            ).start(run.attempt)  # fmt: skip
    except BaseException:
        if rank_signal is not None:
            rank_signal.stop()
        liveness.stop()
        if signals is not None:
            signals.restore()
        if owned is not None:
            owned.__exit__(None, None, None)
        raise
    run._owned_world = owned
    run._signals = signals
    return run


def _build(
    settings: RunSettings, world: World, liveness: Liveness, stop: threading.Event, resume: str, progress: ProgressClock
) -> Run:
    writer: Telemetry | None = None  # rank 0's, with telemetry on
    mirrors: Mirrors | None = None
    checkpointer: AsyncCheckpointer | None = None
    resumed_after_step = -1
    failure = ""
    if world.is_writer:
        try:
            writer, resumed_after_step = _writer_telemetry(settings, world, progress)
            if resume == "never" and resumed_after_step >= 0:
                raise PreflightError(
                    f"run {settings.run!r} already holds records through step {resumed_after_step} "
                    "and resume='never': start with a new run id"
                )
            mirrors = _writer_mirrors(settings, writer) if writer is not None else None
        except PreflightError as error:
            failure = str(error)
    telemetry: TelemetrySink = writer if writer is not None else NullTelemetry()
    if world.is_writer and not failure:
        checkpointer = AsyncCheckpointer(
            settings.run_checkpoint_dir,
            upload=Uploader(writer.s3, settings.bucket, settings.experiment, settings.run) if writer else None,
            wait_durable=telemetry.wait_durable,
            on_finished=telemetry.checkpoint_finished,
        )
    failure = world.broadcast(failure)  # every rank stops if rank 0's preflight failed
    if failure:
        raise PreflightError(failure)
    limit = world.broadcast(str(resumed_after_step) if settings.telemetry else "")
    run = Run(
        settings=settings,
        world=world,
        progress=progress,
        telemetry=telemetry,
        checkpointer=checkpointer,
        resume_limit=int(limit) if limit else None,
        liveness=liveness,
        stop=stop,
        mirrors=mirrors,
    )
    # A framework's checkpoint: rank 0 decides (its files may be on rank 0's disk alone), all follow.
    committed = world.broadcast(
        json.dumps(_framework_resume_point(settings, run.resume_limit) if world.is_writer else None)
    )
    if (framework := json.loads(committed)) is not None:
        run.resume_step, run.resume_checkpoint = int(framework[0]) + 1, framework[1]
        log.info("rank %d resumes after step %d from %s", world.rank, framework[0], framework[1])
    elif (resume_point := load_resume_point(settings.run_checkpoint_dir, at_most=run.resume_limit)) is not None:
        step, run._resume_state = resume_point
        run.resume_step = step + 1
        log.info(
            "rank %d resumes from %s (step %d)",
            world.rank,
            settings.run_checkpoint_dir / checkpoint_name(step),
            step,
        )
    run.attempt = int(world.broadcast(str(telemetry.begin_attempt())) or 0)  # every rank's evidence names it
    if run.attempt:
        log.info("attempt %d of run %s", run.attempt, settings.run)
    telemetry.start()  # heartbeats from the start of setup: a long setup is not silence
    if mirrors is not None:
        mirrors.start()
    return run


def keep_flight_recorder(settings: RunSettings) -> None:
    """PyTorch's flight recorder for nccl and gloo: the last collectives of each rank, dumped under the
    run's ranks directory when an nccl collective times out, and by each rank's `RankSignal` on a stall
    or SIGTERM (`beacon.evidence.flight_recorder`). The Job sets the same variables; a value already set wins."""
    prefix = str(settings.run_ranks_dir / FLIGHT_RECORDER_PREFIX)
    for name, value in (
        ("TORCH_FR_BUFFER_SIZE", str(FLIGHT_RECORDER_ENTRIES)),
        ("TORCH_NCCL_TRACE_BUFFER_SIZE", str(FLIGHT_RECORDER_ENTRIES)),
        ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"),
        ("TORCH_FR_DUMP_TEMP_FILE", prefix),
        ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", prefix),
    ):
        os.environ.setdefault(name, value)


def _writer_mirrors(settings: RunSettings, telemetry: Telemetry) -> Mirrors | None:
    """A worker per tracker, reading the spool (and S3, for chunks already delivered)."""
    if not settings.mirrors:
        return None
    info = RunInfo(settings.team, settings.experiment, settings.run, settings.run_spool_dir / MIRRORS_DIR)
    fetch = s3_chunks(telemetry.s3, settings.bucket, settings.experiment, settings.run)
    return Mirrors(
        [
            MirrorWorker(
                build(name, settings),
                run=info,
                spool=telemetry.spool,
                fetch=fetch,
                wake=telemetry.watch_durable(),
                spool_finished=telemetry.spool_finished,
            )
            for name in settings.mirrors
        ]
    )


def _framework_resume_point(settings: RunSettings, resume_limit: int | None) -> tuple[int, str | None] | None:
    """The committed framework checkpoint to resume from; None when there is none, or it is ahead of
    the durable records, or it is gone."""
    committed = framework_checkpoint(settings.run_checkpoint_dir)
    if committed is None:
        return None
    step, path = committed
    if resume_limit is not None and step > resume_limit:
        log.warning(
            "committed checkpoint of step %d is ahead of the durable records (step %d): no resume point",
            step,
            resume_limit,
        )
        return None
    if path is not None and "://" not in path and not os.path.exists(path):
        log.warning("committed checkpoint %s of step %d is gone: no resume point", path, step)
        return None
    return committed


def _writer_telemetry(settings: RunSettings, world: World, progress: ProgressClock) -> tuple[Telemetry | None, int]:
    if not settings.telemetry:
        return None, -1
    spool_dir = settings.run_spool_dir
    s3 = aws.client("s3", settings.region)
    cloudwatch = aws.client("cloudwatch", settings.region)
    ssm = aws.client("ssm", settings.region) if settings.alarms else None
    fast: dict[str, Any] = {"attempts": 1, "connect_timeout": 2, "read_timeout": 5}  # preflight retries in its budget
    started = time.monotonic()
    try:
        record = run_preflight(
            settings,
            spool_dir=spool_dir,
            world_size=world.size,
            s3=aws.client("s3", settings.region, **fast),
            cloudwatch=aws.client("cloudwatch", settings.region, **fast),
            ssm=aws.client("ssm", settings.region, **fast) if settings.alarms else None,
        )
    except PreflightError as error:
        raise PreflightError(f"{error} (preflight stopped after {time.monotonic() - started:.1f} s)") from None
    log.info("preflight passed in %.1f s: spool on %s", time.monotonic() - started, record.spool_filesystem)
    try:  # before the spool recovers anything: a live writer's open chunk is its own
        owner = SpoolOwner.claim(spool_dir, run=settings.run)
    except SpoolOwnedError as error:
        raise PreflightError(str(error)) from None
    spool = Spool(spool_dir, owner=owner)
    if spool.recovered_records:
        log.info("recovered %d records from an interrupted chunk", spool.recovered_records)
    try:
        reconciled = reconcile(
            s3, bucket=settings.bucket, experiment=settings.experiment, run=settings.run, spool=spool
        )
    except RunConflictError as error:
        spool.close()  # its owner released: this process writes nothing
        raise PreflightError(str(error)) from None
    except (ClientError, BotoCoreError) as error:
        spool.close()
        raise PreflightError(
            f"run {settings.run!r}: cannot read what s3://{settings.bucket}/"
            f"{contract.run_prefix(settings.experiment, settings.run)} already holds ({error})"
        ) from None
    if reconciled.continued_after_chunk >= 0:
        log.info(
            "S3 holds %d chunks of this run: continuing after chunk %d (step %d)",
            reconciled.chunks_in_s3,
            reconciled.continued_after_chunk,
            spool.last_step,
        )
    alarms = (
        RunAlarms(cloudwatch, ssm, settings.team, settings.experiment, settings.run, settings.slow_rank_share)
        if ssm is not None
        else None
    )
    telemetry = Telemetry(
        settings, s3=s3, cloudwatch=cloudwatch, progress=progress, spool=spool, run_alarms=alarms,
        ranks_dir=settings.run_ranks_dir, world_size=world.size, node_rank=int(os.environ.get("GROUP_RANK", "-1")),
    )  # fmt: skip
    return telemetry, spool.last_step
