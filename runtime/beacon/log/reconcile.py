"""The spool against what S3 already holds for the run, once, at start.

A run id reused on a new volume (a new PVC, an emptyDir, a SageMaker restore that brought back some
files and not others) meets chunks in S3 that its spool knows nothing of. Before, the spool numbered
its first chunk 0 again, S3 refused it (another chunk holds that key) on every retry, and the job
never delivered another record. Now the spool continues after what S3 holds; a pending chunk S3
already holds byte for byte counts as delivered; only a pending chunk whose key S3 holds with
*other* bytes is a true conflict, and the job refuses to start, naming the run.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from beacon import contract
from beacon.log.spool import Spool

log = logging.getLogger("beacon.reconcile")


class RunConflictError(Exception):
    """Durable bytes disagree: the spool and S3 hold different records under one key."""


@dataclass(frozen=True)
class Reconciliation:
    chunks_in_s3: int
    already_delivered: int  # pending chunks S3 already held, byte for byte
    continued_after_chunk: int  # -1 when S3 held nothing for the run


def chunk_numbers_in_s3(s3: Any, bucket: str, experiment: str, run: str) -> list[int]:
    prefix = contract.run_prefix(experiment, run) + contract.EVENTS + "/"
    numbers: list[int] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            if (number := contract.chunk_of_events_key(item["Key"])) is not None:
                numbers.append(number)
    return sorted(numbers)


def reconcile(s3: Any, *, bucket: str, experiment: str, run: str, spool: Spool) -> Reconciliation:
    in_s3 = chunk_numbers_in_s3(s3, bucket, experiment, run)
    if in_s3:
        spool.after_s3(in_s3[-1])  # a chunk numbered without the spool's state follows what S3 holds
    held = set(in_s3)
    delivered = 0
    for chunk in spool.pending():
        if chunk.sequence not in held:
            continue
        key = contract.events_key(experiment, run, chunk.sequence)
        theirs = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        if hashlib.sha256(theirs).digest() != hashlib.sha256(chunk.body()).digest():
            local = {r.seq for r in contract.records_of(chunk.body())}
            if chunk.sequence in spool.repaired and local <= {r.seq for r in contract.records_of(theirs)}:
                # S3 took it whole before the damage: every record kept here is in its copy, the one kept
                log.warning("chunk %d: s3://%s/%s holds it whole; the damaged copy is let go", chunk.sequence,
                            bucket, key)  # fmt: skip
                spool.acknowledge(chunk)
                delivered += 1
                continue
            raise RunConflictError(
                f"run {run!r}: chunk {chunk.sequence} in the spool ({chunk.path}) differs from s3://{bucket}/{key}: "
                "another job wrote this run id; start with a new --run-id (the spool keeps its records)"
            )
        spool.acknowledge(chunk)
        delivered += 1
    if not in_s3:
        spool.recover_journal()
        return Reconciliation(0, delivered, -1)
    last = in_s3[-1]
    body = s3.get_object(Bucket=bucket, Key=contract.events_key(experiment, run, last))["Body"].read()
    records = contract.records_of(body)
    seq = max((r.seq for r in records), default=-1)
    step = max((r.step for r in records), default=-1)
    attempt = max((r.attempt for r in records), default=-1)
    spool.continue_after(chunk=last, seq=seq, step=step, attempt=attempt)
    spool.remember(records)
    # Last: the steps a SIGKILL left in the journal are numbered after, and never repeat, what S3 holds.
    spool.recover_journal()
    return Reconciliation(len(in_s3), delivered, last)


def is_definitive(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") in ("AccessDenied", "NoSuchBucket", "403", "404")
