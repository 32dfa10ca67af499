"""A long run written straight through the contract, as the uploader leaves it in S3 (event chunks, the
index of each whole group of them, a preflight record per attempt, the final state): the doctor's
any-length figure in `make bench`, and its tests, without a job logging a million records first."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from beacon import contract
from beacon.contract.preflight import PreflightRecord

UPLOAD_THREADS = 16


@dataclass(frozen=True)
class Attempt:
    """One attempt of the run: it logs `steps` steps from `first_step` (a resume goes back to it)."""

    first_step: int
    steps: int


def long_run_records(experiment: str, run: str, attempts: Sequence[Attempt], *, start: float) -> list[contract.Record]:
    """Every record of the run, numbered gapless across attempts as the spool numbers them."""
    records: list[contract.Record] = []
    for attempt, spec in enumerate(attempts):
        for step in range(spec.first_step, spec.first_step + spec.steps):
            metrics = {contract.LOSS_KEY: 1.0 / (1 + step), "lr": 0.001}
            records.append(
                contract.Record(experiment, run, step, metrics, start + len(records) * 0.01, len(records), 0, attempt)
            )
    return records


def write_long_run(
    s3: Any,
    *,
    bucket: str,
    experiment: str,
    run: str,
    attempts: Sequence[Attempt],
    chunk_records: int = 500,
    lost_chunks: Sequence[int] = (),
    final: bool = True,
) -> list[contract.Record]:
    """Writes the run and returns its records. `lost_chunks`: chunks never uploaded (their group gets no
    index, as the uploader writes a group's index only once S3 holds every chunk of it)."""
    start = time.time() - 3600
    records = long_run_records(experiment, run, attempts, start=start)
    chunks = [records[at : at + chunk_records] for at in range(0, len(records), chunk_records)]
    objects: dict[str, bytes] = {}
    for number, chunk in enumerate(chunks):
        if number not in lost_chunks:
            objects[contract.events_key(experiment, run, number)] = b"".join(r.to_line() for r in chunk)
    for group in range(len(chunks) // contract.INDEX_GROUP):
        numbers = range(group * contract.INDEX_GROUP, (group + 1) * contract.INDEX_GROUP)
        if not set(numbers) & set(lost_chunks):
            summaries = [contract.ChunkSummary.of(n, chunks[n]) for n in numbers]
            objects[contract.index_key(experiment, run, group)] = contract.index_document(group, summaries)
    for attempt in range(len(attempts)):
        preflight = PreflightRecord(
            run=run, experiment=experiment, host="train-0", pid=1, world_size=1, spool_dir="/artifacts/spool",
            spool_filesystem="nfs4", spool_persistent=True, started_at=f"attempt {attempt}", team="demo",
            region="us-east-1", s3_endpoint="", namespace="training",
            heartbeat_interval=float(contract.HEARTBEAT_INTERVAL_S),
        )  # fmt: skip
        objects[contract.preflight_key(experiment, run, f"{attempt:04d}.json")] = json.dumps(asdict(preflight)).encode()
    if final:
        ended = {"state": contract.FinalState.FINISHED, "last_step": records[-1].step, "attempt": len(attempts) - 1,
                 "ended_at": records[-1].wall_time}  # fmt: skip
        objects[contract.final_status_key(experiment, run)] = json.dumps(ended).encode()
    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        list(pool.map(lambda item: s3.put_object(Bucket=bucket, Key=item[0], Body=item[1]), objects.items()))
    return records
