"""`beacon doctor` on a run of any length, and advice a user can follow: the doctor reads a long run's
index and its tail, never every chunk, and says which verdicts come from the tail; a missing bucket,
a missing stack and a writer role it cannot probe are each named as what they are."""

from __future__ import annotations

from typing import Any

import pytest
from beacon import contract

from beacon_ops.doctor.diagnosis import Diagnosis, DoctorInputs, diagnose
from beacon_ops.evidence.reading import read_run
from beacon_ops.local.long_run import Attempt, write_long_run
from tests.support.cli import against, beacon
from tests.support.moto_server import REGION, MotoServer

BUCKET = "beacon-long-run"


class CountedGets:
    """The keys the doctor's S3 client reads, through botocore's own event hook."""

    def __init__(self, s3: Any) -> None:
        self.keys: list[str] = []
        s3.meta.events.register("before-call.s3.GetObject", self._seen)

    def _seen(self, params: dict[str, Any], **_: Any) -> None:
        self.keys.append(str(params.get("url_path", "")))

    def under(self, kind: str) -> int:
        return sum(f"/{kind}/" in key for key in self.keys)


@pytest.fixture
def s3(moto_server: MotoServer) -> Any:
    client = moto_server.client("s3")
    client.create_bucket(Bucket=BUCKET)
    return client


def doctor(moto_server: MotoServer, run: str, *, s3: Any | None = None, bucket: str = BUCKET) -> Diagnosis:
    return diagnose(
        DoctorInputs(
            team="demo",
            experiment="smoke",
            run=run,
            bucket=bucket,
            region=REGION,
            s3=s3 or moto_server.client("s3"),
            cloudwatch=moto_server.client("cloudwatch"),
        )
    )


def check(result: Diagnosis, name: str) -> tuple[str, str, str]:
    found = next(v for v in result.verdicts if v.check == name)
    return found.verdict, found.evidence, found.fix


def test_a_long_run_is_diagnosed_from_its_index_and_tail_without_reading_every_chunk(
    moto_server: MotoServer, s3: Any
) -> None:
    """3 whole groups of 64 chunks and a tail of 5: the doctor reads 3 index documents and 5 chunks, and
    still counts every record and names the last step."""
    chunks = 3 * contract.INDEX_GROUP + 5
    write_long_run(
        s3, bucket=BUCKET, experiment="smoke", run="long", attempts=[Attempt(0, chunks * 20)], chunk_records=20
    )
    reader = moto_server.client("s3")
    gets = CountedGets(reader)
    result = doctor(moto_server, "long", s3=reader)
    assert (gets.under(contract.INDEX), gets.under(contract.EVENTS)) == (3, 5), gets.keys
    verdict, evidence, _ = check(result, "delivery")
    assert verdict == "delivered", evidence
    assert evidence.startswith(f"{chunks * 20} records in S3 ({3 * contract.INDEX_GROUP} chunks counted"), evidence
    assert f"last step {chunks * 20 - 1}" in evidence
    assert check(result, "ranks")[1] == "the last 100 records, all from rank 0", "said to come from the tail"
    assert result.diagnosis == "finished"


@pytest.mark.parametrize(
    ("attempts", "chunk_records"),
    [
        # attempt 1 resumes at step 1,000 after attempt 0 reached 1,499, inside an indexed group; a third attempt
        ([Attempt(0, 1500), Attempt(1000, 900), Attempt(1700, 50)], 7),
        # exactly one whole group: the tail is empty, and the newest attempt's steps are in indexed chunks
        ([Attempt(0, 305), Attempt(250, 335)], 10),
    ],
    ids=["resumed-inside-a-group", "empty-tail"],
)
def test_the_tail_reading_gives_the_full_readings_last_step_and_count_across_resumes(
    s3: Any, attempts: list[Attempt], chunk_records: int
) -> None:
    """The chunk two attempts share is read, so the live history's last step is the newest attempt's, as a full
    read says, whether its later records are in the tail or in indexed chunks."""
    write_long_run(s3, bucket=BUCKET, experiment="smoke", run="resumed", attempts=attempts, chunk_records=chunk_records)
    full = read_run(s3, BUCKET, "smoke", "resumed")
    tail = read_run(s3, BUCKET, "smoke", "resumed", tail_only=True)
    assert tail.indexed and len(tail.records) < len(full.records) / 10, "the index stood in for most chunks"
    assert (tail.last_step, tail.record_count, tail.missing) == (full.last_step, len(full.records), 0)
    assert full.last_step == attempts[-1].first_step + attempts[-1].steps - 1
    newest = max(full.records, key=lambda r: r.wall_time)
    assert tail.newest_record_at == (newest.wall_time, newest.step)


def test_a_chunk_missing_from_a_finished_runs_tail_is_lost_and_counted(moto_server: MotoServer, s3: Any) -> None:
    chunks = contract.INDEX_GROUP + 6
    write_long_run(
        s3,
        bucket=BUCKET,
        experiment="smoke",
        run="gap",
        attempts=[Attempt(0, chunks * 10)],
        chunk_records=10,
        lost_chunks=[66],
    )
    verdict, evidence, fix = check(doctor(moto_server, "gap"), "delivery")
    assert verdict == "lost" and evidence.startswith(f"10 of {chunks * 10} numbered records are not in S3"), evidence
    assert "beacon.sync" in fix


def test_a_missing_bucket_is_named_first_and_nothing_is_called_delivered(moto_server: MotoServer) -> None:
    result = doctor(moto_server, "r", bucket="no-such-bucket")
    assert result.diagnosis == "no-bucket", [(v.check, v.verdict) for v in result.verdicts]
    assert result.headline().startswith("no-bucket: s3://no-such-bucket does not exist in us-east-1"), result.headline()
    assert "make deploy TEAM=demo" in check(result, "endpoint")[2]
    verdict, evidence, _ = check(result, "delivery")
    assert verdict == "unknown" and "NoSuchBucket" in evidence, evidence


def test_a_writer_role_the_doctor_cannot_assume_is_probed_by_a_job_not_an_option(
    moto_server: MotoServer, s3: Any
) -> None:
    """No `--probe` option exists: without a probe, the job's own preflight is the evidence of a write; with
    no preflight either, the fix is a job in the cluster (`beacon smoke`)."""
    write_long_run(s3, bucket=BUCKET, experiment="smoke", run="ran", attempts=[Attempt(0, 30)])
    verdict, evidence, _ = check(doctor(moto_server, "ran"), "permission")
    assert verdict == "wrote at start" and "host train-0" in evidence, evidence
    verdict, _, fix = check(doctor(moto_server, "never-ran"), "permission")
    assert verdict == "not probed" and "beacon smoke --team demo" in fix and "--probe" not in fix


def test_the_cli_names_the_stack_that_is_not_deployed_and_how_to_deploy_it(moto_server: MotoServer) -> None:
    done = beacon("doctor", "--team", "demo", "--run", "r", env=against(moto_server.url))
    assert done.returncode == 2, done.stdout[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert line == (
        "beacon doctor: stack beacon-demo-artifacts not found in us-east-1: deploy it first (make deploy TEAM=demo)"
    ), line
