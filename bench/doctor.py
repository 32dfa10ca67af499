"""The doctor on a run of any length (issue 16): a 1,000,000-record run of 2,000 chunks in the local S3,
diagnosed from its index and tail, median of rounds; beside it, one reading of every chunk (what
`beacon smoke`'s complete verification does on a smoke-sized run)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from beacon import contract

from beacon_ops.doctor.diagnosis import DoctorInputs, diagnose
from beacon_ops.evidence.reading import read_run
from beacon_ops.local.long_run import Attempt, write_long_run

RUN = "doctor-long-run"


def bench_doctor(
    *,
    s3_writer: Any,
    s3_reader: Any,
    cloudwatch: Any,
    bucket: str,
    region: str,
    records: int = 1_000_000,
    chunk_records: int = 500,
    rounds: int = 3,
) -> dict[str, Any]:
    write_long_run(
        s3_writer,
        bucket=bucket,
        experiment="smoke",
        run=RUN,
        attempts=[Attempt(0, records)],
        chunk_records=chunk_records,
    )
    inputs = DoctorInputs(
        team="demo", experiment="smoke", run=RUN, bucket=bucket, region=region, s3=s3_reader, cloudwatch=cloudwatch
    )
    times, diagnosis = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        diagnosis = diagnose(inputs)
        times.append(time.perf_counter() - started)
    assert diagnosis is not None
    delivery = next(v for v in diagnosis.verdicts if v.check == "delivery")
    if not delivery.evidence.startswith(f"{records} records in S3"):
        raise RuntimeError(f"the doctor miscounted the long run: {delivery.evidence}")
    started = time.perf_counter()
    every = read_run(s3_reader, bucket, "smoke", RUN)
    full_read_s = time.perf_counter() - started
    return {
        "doctor_long_run_records": records,
        "doctor_long_run_chunks": len(every.chunk_keys),
        "doctor_long_run_index_documents": len(every.chunk_keys) // contract.INDEX_GROUP,
        "doctor_long_run_s": statistics.median(times),
        "doctor_long_run_diagnosis": diagnosis.diagnosis,
        "doctor_full_read_s": full_read_s,
    }
