"""`python -m beacon.sync <spool dir>`: push a stranded spool (a dead pod's volume, a restored
SageMaker checkpoint directory) to S3 and to the run's tracker mirrors, idempotently.

Run it where the writer's identity is (a pod with the training service account mounting the volume,
or any shell holding the writer role). The spool directory is `<spool root>/<experiment>/<run>`.
What S3 already holds byte for byte is acknowledged, not sent again; a chunk S3 holds with other
bytes is a conflict, refused with one line naming the run; the torn tail of the open chunk was never
durable and is cut, as a restarted job would. While it pushes it owns the directory (`spool_owner`):
a live job's directory is refused, naming the job. Each outcome has its exit code (`Outcome`).

Then each tracker the job mirrored to (a cursor under `<spool dir>/mirrors/`, or `--mirror NAME`) gets what
its cursor had not reached, exactly once (the mirror worker asks the tracker what it holds), and the run's final
state: the one the job wrote to S3, else `failed` (it ended without one). Tracker settings come from the same
BEACON_* variables the job read (BEACON_MLFLOW_TRACKING_URI, BEACON_WANDB_PROJECT, ...).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import IntEnum
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from beacon import aws, contract
from beacon.contract import FinalState
from beacon.contract.preflight import preflight_document
from beacon.create_only import Written, put_create_only
from beacon.evidence.ranks import upload_rank_evidence
from beacon.log.reconcile import RunConflictError, reconcile
from beacon.log.spool import FULL, OPEN, STATE, Spool, lost_values
from beacon.log.spool_owner import SpoolOwnedError, SpoolOwner, read_owner
from beacon.process.preflight import PreflightError
from beacon.settings import SettingsError
from beacon.sinks.chunk_delivery import deliver_chunk
from beacon.sinks.index import IndexWriter
from beacon.sinks.mirrors import Mirror, RunInfo
from beacon.sinks.mirrors.worker import MIRRORS_DIR, MirrorReport, MirrorWorker, s3_chunks

# A spool an older release wrote (no owner record) this recently may still belong to a live job.
QUIET_S = 60.0
MIRROR_TIMEOUT_S = 300.0  # per tracker: what it has not taken by then stays behind its cursor for the next sync


class Outcome(IntEnum):
    """The exit code of each outcome, so a script can tell them apart."""

    SYNCED = 0  # everything the spool holds is in S3 and with every tracker (or nothing was left to do)
    BAD_INPUT = 2  # the path, the bucket or a tracker setting
    OWNED = 3  # a live job owns the directory, or S3 holds other bytes for a chunk (another writer)
    TRACKER_BEHIND = 4  # S3 has everything; a tracker did not take all in time (its cursor keeps the rest)
    VOLUME_FULL = 5  # nothing could be written to the spool's volume: free space, nothing was deleted
    S3_FAILED = 6  # S3 refused or could not be reached: the spool keeps everything for the next sync


EPILOG = "exit codes: " + "; ".join(
    f"{o.value} {text}"
    for o, text in (
        (Outcome.SYNCED, "synced, or nothing to do"),
        (Outcome.BAD_INPUT, "bad input"),
        (Outcome.OWNED, "a live job owns the spool, or another writer's chunk is in S3"),
        (Outcome.TRACKER_BEHIND, "a tracker is behind (a later sync sends the rest)"),
        (Outcome.VOLUME_FULL, "the spool's volume is full"),
        (Outcome.S3_FAILED, "S3 failed"),
    )
)


class SyncRefused(Exception):
    """One line: why the spool was not pushed, and the outcome it is."""

    def __init__(self, message: str, outcome: Outcome = Outcome.OWNED) -> None:
        super().__init__(message)
        self.outcome = outcome


@dataclass
class SyncReport:
    experiment: str
    run: str
    chunks_uploaded: int = 0
    already_in_s3: int = 0
    records_sent: int = 0
    rank_files: int = 0  # progress documents and dumps the dead job's ranks left under `ranks/`
    final_state: str = ""  # what the trackers were told
    mirrors: dict[str, MirrorReport] = field(default_factory=dict)
    damage: list[str] = field(default_factory=list)  # what the spool's recovery could not read, named
    end_written: bool = False  # the attempt had no final state: sync wrote its end (failed, no clean exit)
    values_lost: dict[str, int] = field(default_factory=dict)  # pending values (tensors) the kill took, by metric
    lines_set_aside: int = 0


def mirrored_trackers(directory: Path) -> list[str]:
    """The trackers the job mirrored this run to: a cursor each under `mirrors/`."""
    return sorted(p.stem for p in (directory / MIRRORS_DIR).glob("*.json"))


def _final_state(s3: Any, bucket: str, experiment: str, run: str, attempt: int) -> FinalState:
    """The final state the job wrote for this spool's attempt; `failed` when it wrote none (an earlier attempt's
    does not count: `contract.final_state_superseded`)."""
    try:
        body = s3.get_object(Bucket=bucket, Key=contract.final_status_key(experiment, run))["Body"].read()
        final = contract.final_state_document(body)
    except ClientError as error:
        if error.response["Error"]["Code"] not in ("NoSuchKey", "404"):
            raise
        return FinalState.FAILED  # the job ended without a final state: killed, or its node lost
    except ValueError:  # not a final state a reader takes: as good as none
        return FinalState.FAILED
    if contract.final_state_superseded(final, attempts=(attempt,)):
        return FinalState.FAILED  # an earlier attempt's: this spool's attempt wrote none
    state = final.get("state", FinalState.FINISHED)
    return FinalState(state) if state in set(FinalState) else FinalState.FAILED


KILLED = "no clean exit (killed, or its node lost): its end written by beacon.sync from its spool"


def _end_of_a_killed_attempt(s3: Any, bucket: str, experiment: str, run: str, spool: Spool) -> bool:
    """Write the final state of this volume's attempt when it wrote none (killed outright, its node lost): failed, at
    its newest step, so readers name that step rather than an older document's. Never for an attempt S3 shows a
    later one of (its records, or a preflight that started after this attempt's newest record), never over an end
    this attempt or a later one wrote (`contract.final_state_superseded`). Whether it wrote one."""
    attempt = spool.local_attempt  # this volume's records: S3's last chunk may be a later attempt's, still running
    newest = spool.newest(attempt) if attempt >= 0 else None
    if newest is None or spool.last_attempt > attempt:
        return False
    ended_at, last_step = newest
    end = {"state": FinalState.FAILED.value, "attempt": attempt, "last_step": last_step, "ended_at": ended_at,
           "error": KILLED, "unacknowledged_records": 0, "values_lost": spool.values_lost}  # fmt: skip
    if contract.final_state_superseded(end, attempts_started_at=_starts(s3, bucket, experiment, run)):
        return False  # a later start of the run, on another volume, has not written a record yet
    key = contract.final_status_key(experiment, run)
    try:
        final = contract.final_state_document(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    except ClientError as error:
        if error.response["Error"]["Code"] not in ("NoSuchKey", "404"):
            raise
        final = None
    except ValueError:  # not a final state a reader takes: as good as none
        final = None
    if final is not None and not contract.final_state_superseded(final, attempts=(attempt,)):
        return False  # this attempt ended cleanly, or a later one has
    body = json.dumps(end).encode()
    if final is None:  # none there: created only if still none (an attempt ending meanwhile wins)
        return put_create_only(s3, bucket=bucket, key=key, body=body, compare=False).written is Written.CREATED
    s3.put_object(Bucket=bucket, Key=key, Body=body)  # over an earlier attempt's end, as each attempt's end does
    return True


def _starts(s3: Any, bucket: str, experiment: str, run: str) -> list[float]:
    """When each start of the run that passed its preflight began, as its preflight record says."""
    prefix = contract.run_prefix(experiment, run) + f"{contract.PREFLIGHT}/"
    started = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            try:
                record = preflight_document(s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read())
                if not record.get("failed"):
                    started.append(datetime.fromisoformat(str(record["started_at"])).timestamp())
            except (ValueError, KeyError):  # not a preflight record a reader takes: no start it proves
                continue
    return started


def _mirror(
    mirror: Mirror, *, spool: Spool, s3: Any, bucket: str, info: RunInfo, state: FinalState, timeout_s: float
) -> MirrorReport:
    """Replay what the tracker's cursor has not reached, then the final state, on a worker as the job runs it."""
    worker = MirrorWorker(
        mirror,
        run=info,
        spool=spool,
        fetch=s3_chunks(s3, bucket, info.experiment, info.run),
        wake=threading.Event(),
        spool_finished=lambda: True,  # nothing writes this spool any more
    )
    worker.start()
    worker.finishing(state)
    return worker.join(timeout_s)


def sync_spool(
    directory: Path,
    *,
    s3: Any,
    bucket: str,
    quiet_s: float = QUIET_S,
    mirrors: Sequence[Mirror] = (),
    team: str = "",
    mirror_timeout_s: float = MIRROR_TIMEOUT_S,
) -> SyncReport:
    directory = directory.resolve()
    if not directory.is_dir():
        raise SyncRefused(f"spool dir {directory}: not a directory", Outcome.BAD_INPUT)
    experiment, run = directory.parent.name, directory.name
    for kind, value in (("experiment", experiment), ("run", run)):
        try:
            contract.validate_id(kind, value)
        except ValueError as error:
            raise SyncRefused(
                f"spool dir {directory}: expected <spool root>/<experiment>/<run>; {error}", Outcome.BAD_INPUT
            ) from None
    if read_owner(directory) is None:  # an older release kept no owner record: its last write is all there is
        newest = max((p.stat().st_mtime for p in (directory / OPEN, directory / STATE) if p.exists()), default=0.0)
        if time.time() - newest < quiet_s:
            raise SyncRefused(
                f"spool dir {directory}: written {time.time() - newest:.0f} s ago; a live job may still own it "
                f"(wait {quiet_s:.0f} s after it stopped)"
            )
    try:
        owner = SpoolOwner.claim(directory, run=run)
        spool = Spool(directory, owner=owner)  # seals what the dead job left open; a torn tail is cut
    except SpoolOwnedError as error:
        raise SyncRefused(str(error)) from None
    except OSError as error:
        if error.errno in FULL:
            raise _volume_full(directory, error) from None
        raise
    report = SyncReport(experiment, run, damage=list(spool.damage), lines_set_aside=spool.lines_set_aside)
    report.values_lost = spool.values_lost  # filled by reconcile's journal recovery, below
    index = IndexWriter(s3, bucket=bucket, experiment=experiment, run=run)
    try:
        reconciled = reconcile(s3, bucket=bucket, experiment=experiment, run=run, spool=spool)
        report.already_in_s3 = reconciled.already_delivered
        for chunk in spool.pending():
            outcome = deliver_chunk(s3, bucket=bucket, spool=spool, index=index, chunk=chunk, body=chunk.body()).outcome
            if outcome.retry and outcome.error is not None:  # the spool keeps the chunk: a later sync sends it
                raise outcome.error
            if outcome.written is Written.CREATED:
                report.chunks_uploaded += 1
                report.records_sent += chunk.records
            else:
                report.already_in_s3 += 1
        report.end_written = _end_of_a_killed_attempt(s3, bucket, experiment, run, spool)
        report.rank_files = upload_rank_evidence(
            s3, bucket=bucket, experiment=experiment, run=run, attempt=max(spool.last_attempt, 0),
            directory=directory / contract.RANKS,
        )  # fmt: skip
        if mirrors:
            state = _final_state(s3, bucket, experiment, run, max(spool.last_attempt, 0))
            report.final_state = state.value
            info = RunInfo(team, experiment, run, directory / MIRRORS_DIR)
            for mirror in mirrors:
                report.mirrors[mirror.name] = _mirror(
                    mirror, spool=spool, s3=s3, bucket=bucket, info=info, state=state, timeout_s=mirror_timeout_s
                )
    except RunConflictError as error:
        raise SyncRefused(str(error)) from None
    except (ClientError, BotoCoreError) as error:
        raise SyncRefused(f"s3://{bucket}/{contract.run_prefix(experiment, run)}: {error}", Outcome.S3_FAILED) from None
    except OSError as error:
        if error.errno in FULL:
            raise _volume_full(directory, error) from None
        raise
    finally:
        spool.close()
    return report


def _volume_full(directory: Path, error: OSError) -> SyncRefused:
    free = os.statvfs(directory)
    return SyncRefused(
        f"spool dir {directory}: its volume is full ({errno.errorcode.get(error.errno or 0, error.errno)}, "
        f"{free.f_bavail * free.f_frsize} bytes free): free space on it and sync again; nothing was deleted",
        Outcome.VOLUME_FULL,
    )


def main(argv: list[str] | None = None) -> Outcome:
    parser = argparse.ArgumentParser(
        prog="python -m beacon.sync", description=__doc__.splitlines()[0] if __doc__ else None, epilog=EPILOG
    )
    parser.add_argument("spool_dir", type=Path, help="<spool root>/<experiment>/<run>")
    parser.add_argument("--bucket", default=os.environ.get("BEACON_BUCKET"), help="artifact bucket [BEACON_BUCKET]")
    parser.add_argument(
        "--region",
        default=os.environ.get("BEACON_REGION") or os.environ.get("AWS_REGION") or "us-east-1",
        help="AWS region [AWS_REGION]",
    )
    parser.add_argument(
        "--mirror",
        action="append",
        dest="mirrors",
        metavar="TRACKER",
        help="a tracker to mirror to (repeatable) [the trackers with a cursor under <spool dir>/mirrors/]",
    )
    parser.add_argument("--no-mirrors", action="store_true", help="push to S3 only")
    args = parser.parse_args(argv)
    if not args.bucket:
        print("python -m beacon.sync: error: --bucket: required (or set BEACON_BUCKET)", file=sys.stderr)
        return Outcome.BAD_INPUT
    try:
        mirrors = [] if args.no_mirrors else _mirrors_of(args.spool_dir, args.mirrors, args.bucket)
    except (SettingsError, PreflightError) as error:
        print(f"python -m beacon.sync: error: {error}", file=sys.stderr)
        return Outcome.BAD_INPUT
    try:
        report = sync_spool(
            args.spool_dir,
            s3=aws.client("s3", args.region),
            bucket=args.bucket,
            mirrors=mirrors,
            team=os.environ.get("BEACON_TEAM", ""),
        )
    except SyncRefused as error:
        print(f"beacon sync: {error}", file=sys.stderr)
        return error.outcome
    print(
        f"beacon sync: {report.experiment}/{report.run}: {report.chunks_uploaded} chunk(s) uploaded "
        f"({report.records_sent} records), {report.already_in_s3} already in s3://{args.bucket}; "
        f"{report.rank_files} rank file(s)"
        + ("; its attempt ended without a final state: written (failed, no clean exit)" if report.end_written else "")
    )
    if report.damage:  # a torn page after a lost machine: what was readable went up, the rest is named here
        print(f"beacon sync: the spool was damaged: {report.lines_set_aside} line(s) set aside; "
              + "; ".join(report.damage))  # fmt: skip
    if report.values_lost:
        print(f"beacon sync: values the kill took before they were read (tensors), their steps kept: "
              f"{lost_values(report.values_lost)}")  # fmt: skip
    for name, mirrored in report.mirrors.items():
        closed = f"final state {report.final_state}" if mirrored.closed else "not closed"
        print(f"beacon sync: {name}: {mirrored.sent} record(s) mirrored, {mirrored.behind} behind, {closed}")
    return Outcome.SYNCED if all(m.closed for m in report.mirrors.values()) else Outcome.TRACKER_BEHIND


def _mirrors_of(directory: Path, named: list[str] | None, bucket: str) -> list[Mirror]:
    """The trackers to mirror to, built from the BEACON_* settings the job read; one line naming the setting when
    one is missing or unusable."""
    from beacon.settings import RunSettings
    from beacon.sinks.mirrors import build

    trackers = tuple(named or mirrored_trackers(directory))
    if not trackers:
        return []
    resolved = directory.resolve()
    settings = RunSettings.resolve(
        experiment=resolved.parent.name, run=resolved.name, bucket=bucket, mirrors=trackers, alarms=False
    )
    return [build(name, settings) for name in trackers]


if __name__ == "__main__":
    sys.exit(main())
