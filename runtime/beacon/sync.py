"""`python -m beacon.sync <spool dir>`: push a stranded spool (a dead pod's volume, a restored
SageMaker checkpoint directory) to S3, idempotently.

Run it where the writer's identity is (a pod with the training service account mounting the volume,
or any shell holding the writer role). The spool directory is `<spool root>/<experiment>/<run>`.
What S3 already holds byte for byte is acknowledged, not sent again; a chunk S3 holds with other
bytes is a conflict, refused with one line naming the run; the torn tail of the open chunk was never
durable and is cut, as a restarted job would. Exit codes: 0 synced, 2 bad input, 3 refused.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from beacon import aws, contract
from beacon.index import IndexWriter
from beacon.ranks import upload_rank_evidence
from beacon.reconcile import RunConflictError, reconcile
from beacon.spool import OPEN, STATE, Spool

# A spool written this recently may still belong to a live job: two writers would race.
QUIET_S = 60.0
EXIT_BAD_INPUT, EXIT_REFUSED = 2, 3


class SyncRefused(Exception):
    """One line: why the spool was not pushed."""


@dataclass
class SyncReport:
    experiment: str
    run: str
    chunks_uploaded: int = 0
    already_in_s3: int = 0
    records_sent: int = 0
    rank_files: int = 0  # progress documents and dumps the dead job's ranks left under `ranks/`


def sync_spool(directory: Path, *, s3: Any, bucket: str, quiet_s: float = QUIET_S) -> SyncReport:
    directory = directory.resolve()
    if not directory.is_dir():
        raise SyncRefused(f"spool dir {directory}: not a directory")
    experiment, run = directory.parent.name, directory.name
    for kind, value in (("experiment", experiment), ("run", run)):
        try:
            contract.validate_id(kind, value)
        except ValueError as error:
            raise SyncRefused(f"spool dir {directory}: expected <spool root>/<experiment>/<run>; {error}") from None
    newest = max((p.stat().st_mtime for p in (directory / OPEN, directory / STATE) if p.exists()), default=0.0)
    if time.time() - newest < quiet_s:
        raise SyncRefused(
            f"spool dir {directory}: written {time.time() - newest:.0f} s ago; a live job may still own it "
            f"(wait {quiet_s:.0f} s after it stopped)"
        )
    spool = Spool(directory)  # seals what the dead job left open; a torn tail is cut
    report = SyncReport(experiment, run)
    index = IndexWriter(s3, bucket=bucket, experiment=experiment, run=run)
    try:
        reconciled = reconcile(s3, bucket=bucket, experiment=experiment, run=run, spool=spool)
        report.already_in_s3 = reconciled.already_delivered
        for chunk in spool.pending():
            key = contract.events_key(experiment, run, chunk.sequence)
            body = chunk.body()
            try:
                s3.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
                report.chunks_uploaded += 1
                report.records_sent += chunk.records
            except ClientError as error:
                if error.response["Error"]["Code"] != "PreconditionFailed":
                    raise
                theirs = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
                if hashlib.sha256(theirs).digest() != hashlib.sha256(body).digest():
                    raise RunConflictError(
                        f"run {run!r}: s3://{bucket}/{key} holds another chunk than {chunk.path}: "
                        "another job wrote this run id (the spool keeps its records)"
                    ) from None
                report.already_in_s3 += 1
            spool.acknowledge(chunk)
            index.acknowledged(chunk.summary(body))
        report.rank_files = upload_rank_evidence(
            s3, bucket=bucket, experiment=experiment, run=run, attempt=max(spool.last_attempt, 0),
            directory=directory / contract.RANKS,
        )  # fmt: skip
    except RunConflictError as error:
        raise SyncRefused(str(error)) from None
    except (ClientError, BotoCoreError) as error:
        raise SyncRefused(f"s3://{bucket}/{contract.run_prefix(experiment, run)}: {error}") from None
    finally:
        spool.close()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m beacon.sync", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("spool_dir", type=Path, help="<spool root>/<experiment>/<run>")
    parser.add_argument("--bucket", default=os.environ.get("BEACON_BUCKET"), help="artifact bucket [BEACON_BUCKET]")
    parser.add_argument(
        "--region",
        default=os.environ.get("BEACON_REGION") or os.environ.get("AWS_REGION") or "us-east-1",
        help="AWS region [AWS_REGION]",
    )
    args = parser.parse_args(argv)
    if not args.bucket:
        print("python -m beacon.sync: error: --bucket: required (or set BEACON_BUCKET)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        report = sync_spool(args.spool_dir, s3=aws.client("s3", args.region), bucket=args.bucket)
    except SyncRefused as error:
        print(f"beacon sync: {error}", file=sys.stderr)
        return EXIT_REFUSED
    print(
        f"beacon sync: {report.experiment}/{report.run}: {report.chunks_uploaded} chunk(s) uploaded "
        f"({report.records_sent} records), {report.already_in_s3} already in s3://{args.bucket}; "
        f"{report.rank_files} rank file(s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
