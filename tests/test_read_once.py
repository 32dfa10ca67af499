"""A failed run is read once: verification and the doctor share one reading of S3 (the smoke flow
passes it on) and one answer per metric question (`MetricsReadOnce`), and reach the same verdicts as
readers that ask again."""

from __future__ import annotations

import json
from typing import Any

from beacon import contract

from beacon_ops.doctor.after_run import verify_and_diagnose
from beacon_ops.doctor.diagnosis import DoctorInputs, diagnose
from beacon_ops.evidence.alarms import AlarmSet
from beacon_ops.evidence.reading import MetricsReadOnce, read_run
from beacon_ops.evidence.verify import Expected, read_and_verify
from beacon_ops.local.long_run import Attempt, write_long_run
from tests.support.moto_server import REGION, MotoServer

BUCKET = "beacon-read-once"


def questions(cloudwatch: Any) -> list[str]:
    """Every GetMetricStatistics request `cloudwatch` sends, its window left out (botocore's own hook)."""
    sent: list[str] = []

    def seen(params: dict[str, Any], **_: Any) -> None:
        sent.append(json.dumps({k: v for k, v in params.items() if k not in ("StartTime", "EndTime")}, sort_keys=True))

    cloudwatch.meta.events.register("before-parameter-build.cloudwatch.GetMetricStatistics", seen)
    return sent


def verify_then_diagnose(moto_server: MotoServer, cloudwatch: Any) -> list[tuple[str, str]]:
    s3 = moto_server.client("s3")
    evidence, _ = read_and_verify(
        s3=s3,
        cloudwatch=cloudwatch,
        bucket=BUCKET,
        team="demo",
        experiment="smoke",
        run="read-once",
        expected=Expected(steps=None, checkpoint=False, alarms_armed=False),
        alarms=AlarmSet({}, {}),
    )
    inputs = DoctorInputs(
        team="demo", experiment="smoke", run="read-once", bucket=BUCKET, region=REGION, s3=s3, cloudwatch=cloudwatch
    )
    return [(v.check, v.verdict) for v in diagnose(inputs, evidence=evidence).verdicts]


def test_verification_and_the_doctor_ask_each_metric_question_once(moto_server: MotoServer) -> None:
    moto_server.client("s3").create_bucket(Bucket=BUCKET)
    write_long_run(
        moto_server.client("s3"), bucket=BUCKET, experiment="smoke", run="read-once", attempts=[Attempt(0, 50)]
    )
    dims = contract.run_dimensions("demo", "smoke", "read-once")
    moto_server.client("cloudwatch").put_metric_data(
        Namespace=contract.metric_namespace("demo"),
        MetricData=[
            {
                "MetricName": contract.HEARTBEAT.name,
                "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
                "Value": 1.0,
            }
        ],
    )
    plain = moto_server.client("cloudwatch")
    asked_plainly = questions(plain)
    verdicts_plainly = verify_then_diagnose(moto_server, plain)
    shared = moto_server.client("cloudwatch")
    asked_once = questions(shared)
    verdicts_once = verify_then_diagnose(moto_server, MetricsReadOnce(shared))
    assert verdicts_once == verdicts_plainly, "the same verdicts from the shared answers"
    assert len(asked_once) == len(set(asked_once)), "no question asked twice"
    assert len(asked_once) < len(asked_plainly), (len(asked_once), len(asked_plainly))


def test_a_run_verification_cannot_read_is_still_diagnosed_by_the_doctors_own_reading(moto_server: MotoServer) -> None:
    """The smoke flow's verdict when the run cannot be read (its bucket is gone): verification says so, and the
    doctor, reading on its own terms, says why, rather than no verdict at all."""
    inputs = DoctorInputs(team="demo", experiment="smoke", run="gone", bucket="beacon-no-such-bucket", region=REGION,
                          s3=moto_server.client("s3"), cloudwatch=moto_server.client("cloudwatch"))  # fmt: skip
    verdict = verify_and_diagnose(
        inputs, expected=Expected(steps=None, checkpoint=False, alarms_armed=False), alarms=AlarmSet({}, {})
    )
    assert verdict.unreadable.startswith("verification could not read the run as the reader role:")
    assert "NoSuchBucket" in verdict.unreadable and verdict.verification is None
    assert verdict.diagnosis is not None and verdict.diagnosis.diagnosis == "no-bucket", verdict.diagnosis


def test_a_final_state_an_earlier_attempt_wrote_is_not_the_runs_while_a_later_attempt_runs(
    moto_server: MotoServer,
) -> None:
    """Attempt 0 was preempted and wrote its final state; attempt 1 resumed from step 40 and is running (or was
    then killed outright, which writes nothing). The status key still holds attempt 0's: the doctor must not say
    "preempted" or "heartbeat stopped on purpose" of the run, and verification must not count it as ended."""
    s3 = moto_server.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    write_long_run(s3, bucket=BUCKET, experiment="smoke", run="resumed", attempts=[Attempt(0, 50), Attempt(40, 5)],
                   final=False)  # fmt: skip
    preempted = {"state": "preempted", "attempt": 0, "signal": "SIGTERM", "last_step": 49, "ended_at": 1000.0}
    s3.put_object(Bucket=BUCKET, Key=contract.final_status_key("smoke", "resumed"), Body=json.dumps(preempted))
    for at, started in (("1", "1970-01-01T00:15:00+00:00"), ("2", "1970-01-01T00:17:00+00:00")):
        preflight = {"host": f"train-{at}", "started_at": started, "spool_dir": "/spool", "spool_filesystem": "nfs4"}
        s3.put_object(
            Bucket=BUCKET, Key=contract.preflight_key("smoke", "resumed", f"{at}.json"), Body=json.dumps(preflight)
        )

    evidence = read_run(s3, BUCKET, "smoke", "resumed")
    assert evidence.final is None and evidence.superseded_final == preempted and evidence.final_state is None
    inputs = DoctorInputs(team="demo", experiment="smoke", run="resumed", bucket=BUCKET, region=REGION, s3=s3,
                          cloudwatch=moto_server.client("cloudwatch"))  # fmt: skip
    verdicts = {v.check: v for v in diagnose(inputs, evidence=evidence).verdicts}
    assert verdicts["job"].verdict == "running", verdicts["job"]
    assert "an earlier attempt ended preempted at step 49" in verdicts["job"].evidence
    assert verdicts["liveness"].verdict != "finished", verdicts["liveness"]

    # An old final state without its attempt: the newer preflight alone shows it was superseded.
    del preempted["attempt"]
    s3.put_object(Bucket=BUCKET, Key=contract.final_status_key("smoke", "resumed"), Body=json.dumps(preempted))
    assert read_run(s3, BUCKET, "smoke", "resumed").final is None
    # The running attempt's own end, written after its preflight: the run's final state.
    finished = {"state": "finished", "attempt": 1, "last_step": 44, "ended_at": 1100.0}
    s3.put_object(Bucket=BUCKET, Key=contract.final_status_key("smoke", "resumed"), Body=json.dumps(finished))
    assert read_run(s3, BUCKET, "smoke", "resumed").final == finished
