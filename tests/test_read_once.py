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
from beacon_ops.evidence.reading import MetricsReadOnce
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
