"""Asynchronous checkpoints: the loop hands over a CPU snapshot and goes on; a thread writes it to the
volume, records it as the latest (write temp, rename) and uploads it. The loop never waits on disk
or network, and neither does the heartbeat.

A checkpoint a framework writes itself (HF Trainer's save, `torch.distributed.checkpoint.async_save`)
is committed instead: a thread waits for the framework's save and for the records, then points
`latest` at the framework's path. Either way `latest` only moves forward, and only to a step whose
records are durable."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from botocore.exceptions import BotoCoreError, ClientError

from beacon import contract, kill_points
from beacon.files import fsync_directory, write_atomically

log = logging.getLogger("beacon.checkpoint")
LATEST = "latest.json"
# In latest.json: the pointer names a checkpoint a framework wrote (its path, or null), not a Beacon file.
FRAMEWORK_KEY = "framework"
COPY_POLL_S = 0.001
COMMIT_POLL_S = 0.25
# After the loop ended: how long a commit still waits for the last records to be fsync'd.
COMMIT_FINAL_WAIT_S = 60.0


def snapshot(state: Any, staging: Any = None) -> Any:
    """A copy of `state` with its tensors on the CPU, so training can change the originals at once.

    Tensors are copied into `staging` (the previous snapshot) where shapes match: reusing its memory
    makes the copy a plain memcpy instead of fresh allocations and page faults on the loop. From a
    GPU, staging is pinned memory and the copies are non-blocking: the loop queues them behind the
    step and goes on; `copies_done` tells the writer when the bytes have landed.
    """
    if isinstance(state, torch.Tensor):
        source = state.detach()
        from_gpu = source.is_cuda
        reusable = (
            isinstance(staging, torch.Tensor)
            and staging.shape == source.shape
            and staging.dtype == source.dtype
            and staging.device.type == "cpu"
            and (not from_gpu or staging.is_pinned())
        )
        if reusable:
            return staging.copy_(source, non_blocking=from_gpu)
        if from_gpu:
            pinned = torch.empty(source.shape, dtype=source.dtype, device="cpu", pin_memory=True)
            return pinned.copy_(source, non_blocking=True)
        return source.to("cpu", copy=True)
    if isinstance(state, dict):
        mapping = staging if isinstance(staging, dict) else {}
        return {k: snapshot(v, mapping.get(k)) for k, v in state.items()}
    if isinstance(state, list | tuple):
        same = isinstance(staging, list | tuple) and len(staging) == len(state)
        items = staging if same else [None] * len(state)
        return type(state)(snapshot(v, p) for v, p in zip(state, items, strict=True))
    return state


def tensors_in(state: Any) -> Iterator[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, dict):
        for value in state.values():
            yield from tensors_in(value)
    elif isinstance(state, list | tuple):
        for value in state:
            yield from tensors_in(value)


def copies_done(state: Any) -> Callable[[], bool]:
    """Whether the non-blocking copies just queued from `state`'s GPU tensors have finished.

    An event queried without blocking: the writer thread polls it, so no host-device
    synchronisation happens anywhere (`make gpu-check` runs the loop in sync-debug mode).
    """
    if not any(tensor.is_cuda for tensor in tensors_in(state)):
        return lambda: True
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record()
    return event.query


def save_file(state: dict[str, Any], path: Path) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def step_of(path: Path) -> int | None:
    """The step of a `step-NNNNNNNN.pt` file; None for any other name."""
    digits = path.name.removeprefix("step-").removesuffix(".pt")
    return int(digits) if path.name.startswith("step-") and path.suffix == ".pt" and digits.isdigit() else None


def _pointer(directory: Path, *, quiet: bool = False) -> dict[str, Any] | None:
    """`latest.json` as written, or None when it is absent or unreadable."""
    try:
        latest = json.loads((directory / LATEST).read_text())
        int(latest["step"])
        if FRAMEWORK_KEY not in latest:
            str(latest["file"])
        return dict(latest)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        if not quiet:
            log.warning("%s is unreadable (%s); ignoring it", directory / LATEST, error)
        return None


def latest_checkpoint(directory: Path) -> tuple[int, Path] | None:
    """The Beacon checkpoint `latest.json` points to; None when it is absent, unreadable, or points
    to a framework's checkpoint (`framework_checkpoint`)."""
    latest = _pointer(directory)
    if latest is None or FRAMEWORK_KEY in latest:
        return None
    return int(latest["step"]), directory / str(latest["file"])


def framework_checkpoint(directory: Path) -> tuple[int, str | None] | None:
    """(step, path) when `latest.json` points to a checkpoint a framework wrote itself and committed
    (`Run.commit_checkpoint`); the path is the framework's own, None if none was given."""
    latest = _pointer(directory, quiet=True)
    if latest is None or FRAMEWORK_KEY not in latest:
        return None
    path = latest[FRAMEWORK_KEY]
    return int(latest["step"]), None if path is None else str(path)


def wait_for_save(future: Any) -> None:
    """Block until a framework's save finished; raise what it raised. Takes a concurrent Future
    (`dcp.async_save`), the AsyncSaveResponse `dcp.async_save` returns with a stager, or a
    torch.futures.Future."""
    future = getattr(future, "upload_completion", future)
    if hasattr(future, "result"):
        future.result()
    else:
        future.wait()


def load_resume_point(directory: Path, *, at_most: int | None = None) -> tuple[int, dict[str, Any]] | None:
    """(step, state) to resume from: the checkpoint `latest.json` points to, or, if that file is gone
    or unreadable, the newest readable checkpoint at or before that step (a checkpoint after it was
    never promoted: records past `latest` may not be durable).

    `at_most` is the last step whose record is durable (in the spool or in S3). A restore that brings
    files back one by one (SageMaker) can return a `latest` newer than the spool: resuming there
    would skip the steps in between for good, so an older checkpoint is taken and they are replayed."""
    pointer = latest_checkpoint(directory)
    if pointer is None:
        return None
    latest_step, latest_path = pointer
    older = sorted(
        (p for p in directory.glob("step-*.pt") if (s := step_of(p)) is not None and s < latest_step),
        key=lambda p: step_of(p) or 0,
        reverse=True,
    )
    candidates = [latest_path, *older]
    if at_most is not None:
        candidates = [p for p in candidates if (latest_step if p == latest_path else step_of(p) or 0) <= at_most]
        if latest_step > at_most:
            log.warning(
                "latest checkpoint (step %d) is ahead of the durable records (step %d): resuming earlier to replay",
                latest_step,
                at_most,
            )
    for path in candidates:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            log.warning("checkpoint %s is missing; trying an older one", path)
            continue
        except Exception as error:  # a torn or corrupt file: torch raises several kinds
            log.warning("checkpoint %s is unreadable (%s); trying an older one", path, error)
            continue
        return int(state.get("step", step_of(path))), state
    log.warning("no readable checkpoint in %s; starting from step 0", directory)
    return None


@dataclass
class Uploader:
    s3: Any
    bucket: str
    experiment: str
    run: str

    def __call__(self, step: int, path: Path) -> None:
        key = contract.checkpoint_key(self.experiment, self.run, step)
        self.s3.upload_file(str(path), self.bucket, key)  # multipart for large states; may overwrite


class AsyncCheckpointer:
    def __init__(
        self,
        directory: Path,
        *,
        upload: Callable[[int, Path], None] | None,
        wait_durable: Callable[[int, float], bool],
        on_finished: Callable[[float], None],
    ) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.upload = upload
        self.wait_durable = wait_durable
        self.on_finished = on_finished
        self._thread: threading.Thread | None = None
        self._staging: Any = None  # the last snapshot's memory, reused by the next one
        self.commits = FrameworkCommits(self)  # the framework's checkpoints, each on a thread of its own
        self.promotion = threading.Lock()
        self._promoted = -1
        self._loop_over = threading.Event()
        self._last_record_step = -1
        self.saved: list[int] = []
        self.skipped: list[int] = []
        self.failures = 0
        self._skipping = False  # within a run of skipped checkpoints: logged once, at its first

    @property
    def resume_point(self) -> int:
        """The step `latest` points at (-1 before the first): where a crash now would resume after."""
        return self._promoted

    def staged_tensors(self) -> list[torch.Tensor]:
        """The staging memory the next snapshot reuses (pinned when copied from a GPU)."""
        return list(tensors_in(self._staging))

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def save(self, step: int, state: dict[str, Any]) -> bool:
        """Start a checkpoint of `state`; skip (never block) while the previous one is still writing."""
        if self.in_flight:
            self.skipped.append(step)
            if not self._skipping:
                self._skipping = True
                log.warning(
                    "checkpoint of step %d skipped: the one before is still being written (a slow disk, or S3 "
                    "away); a crash now resumes after step %d (skips counted in CheckpointsSkipped and finish())",
                    step,
                    self._promoted,
                )
            return False
        self._skipping = False
        copy = self._staging = snapshot(state, self._staging)  # no write is in flight: safe to reuse
        landed = copies_done(state)
        self._thread = threading.Thread(
            target=self._write, args=(step, copy, landed), name=f"beacon-ckpt-{step}", daemon=True
        )
        self._thread.start()
        return True

    def _write(self, step: int, state: dict[str, Any], landed: Callable[[], bool]) -> None:
        started = time.monotonic()
        name = checkpoint_name(step)
        try:
            while not landed():
                time.sleep(COPY_POLL_S)
            save_file(state, self.directory / name)
            kill_points.hit(kill_points.CHECKPOINT_WRITTEN)
            # The latest pointer moves only once every record through this step is durable, so a
            # resume never skips a step whose record was not yet on disk.
            if not self.wait_durable(step, 60.0):
                log.warning("records through step %d are not durable yet; checkpoint kept but not latest", step)
                return
            if not self.promote(step, {"step": step, "file": name}):
                return
            kill_points.hit(kill_points.CHECKPOINT_PROMOTED)
            self._retain(step)
            if self.upload is not None:
                self.upload(step, self.directory / name)
            self.saved.append(step)
        except (OSError, ClientError, BotoCoreError) as error:
            self.failures += 1
            log.error("checkpoint of step %d failed: %s", step, error)
        finally:
            self.on_finished(time.monotonic() - started)

    def promote(self, step: int, pointer: dict[str, Any]) -> bool:
        """Point `latest` at `step`, unless a later step is already there: commits end out of order."""
        with self.promotion:
            if step <= self._promoted:
                log.info(
                    "checkpoint of step %d is ready after that of step %d: latest stays there", step, self._promoted
                )
                return False
            write_atomically(self.directory / LATEST, json.dumps(pointer).encode())
            self._promoted = step
            return True

    def commit(self, step: int, future: Any, path: str | None) -> None:
        """Make a checkpoint the framework wrote (or is writing: `future`) the resume point, once its
        save finished and every record through `step` is durable. Returns at once (`FrameworkCommits`)."""
        self.commits.start(step, future, path)

    def durable_through(self, step: int) -> bool:
        """Wait until records through `step` are durable. A framework logs when it likes (every 50
        steps, or not at the step it saved at), so while the loop runs this waits for a record at or
        after `step`; once it ended, for the last record there will be."""
        while not self._loop_over.is_set():
            asked = time.monotonic()
            if self.wait_durable(step, COMMIT_POLL_S):
                return True
            if time.monotonic() - asked < COMMIT_POLL_S / 2:  # the spool stopped: no answer will come soon
                self._loop_over.wait(COMMIT_POLL_S)
        return self.wait_durable(min(step, self._last_record_step), COMMIT_FINAL_WAIT_S)

    def loop_over(self, last_step: int) -> None:
        """No record after `last_step` will come: commits waiting for a later one wait for this one."""
        self._last_record_step = last_step
        self._loop_over.set()

    def _retain(self, latest: int) -> None:
        """Keep `latest` and the newest checkpoint before it (a fallback); S3 versions keep all.

        Files after `latest` come from an attempt that died before promoting them: they are not a
        resume point, and by step number alone they would outrank (and delete) `latest`.
        """
        older = sorted(s for p in self.directory.glob("step-*.pt") if (s := step_of(p)) is not None and s < latest)
        keep = {latest, *older[-1:]}
        for path in self.directory.glob("step-*.pt"):
            if step_of(path) not in keep:
                path.unlink(missing_ok=True)

    def join(self, timeout: float) -> bool:
        """Wait for the in-flight checkpoint and commits; False if any is still going after `timeout`."""
        deadline = time.monotonic() + timeout
        for thread in [self._thread, *self.commits.threads]:
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        return not self.in_flight and not any(thread.is_alive() for thread in self.commits.threads)


class FrameworkCommits:
    """The framework's checkpoints (Lightning's, HF Trainer's save), one thread each: made the resume point once the
    framework's save finished and every record through its step is durable. Beacon's own checkpoints are written by
    `AsyncCheckpointer` itself, one at a time; both promote through its one lock."""

    def __init__(self, checkpointer: AsyncCheckpointer) -> None:
        self.checkpointer = checkpointer
        self.threads: list[threading.Thread] = []

    def start(self, step: int, future: Any, path: str | None) -> None:
        self.threads = [thread for thread in self.threads if thread.is_alive()]
        thread = threading.Thread(
            target=self._commit,
            args=(step, future, path, time.monotonic()),
            name=f"beacon-commit-{step}",
            daemon=True,
        )
        self.threads.append(thread)
        thread.start()

    def _commit(self, step: int, future: Any, path: str | None, started: float) -> None:
        checkpointer = self.checkpointer
        try:
            if future is not None:
                wait_for_save(future)
            if not checkpointer.durable_through(step):
                log.warning("records through step %d are not durable; latest stays before it", step)
                return
            checkpointer.promote(step, {"step": step, FRAMEWORK_KEY: path})
            checkpointer.saved.append(step)  # complete and durable, even if a later one was ready first
        except Exception as error:  # whatever the framework's save raised
            with checkpointer.promotion:  # commits run side by side
                checkpointer.failures += 1
            log.error("checkpoint of step %d failed (%s: %s); latest stays", step, type(error).__name__, error)
        finally:
            checkpointer.on_finished(time.monotonic() - started)
