"""Least privilege, for real: the synthesized writer policy and bucket policy, deployed into moto
with IAM enforcement on, then exercised as the writer.

moto ignores every condition in identity policies (s3:prefix, cloudwatch:namespace, kms:ViaService,
s3:if-none-match, aws:SecureTransport ...) and is handed non-S3 resources widened to *: a pass here
proves actions and S3 resources only. What AWS would allow is evaluated on the templates
(test_policies_as_aws_evaluates); the If-None-Match header's own behaviour is proven here.
"""

from __future__ import annotations

from typing import Any

import pytest
from beacon import contract
from botocore.exceptions import ClientError

from beacon_ops.local.provision import UNEVALUABLE_CONDITION_KEYS
from tests.conftest import WriterSession

EVENTS_KEY = contract.events_key("exp-1", "run-1", 0)


def error_code(call: Any, **kwargs: Any) -> str:
    with pytest.raises(ClientError) as raised:
        call(**kwargs)
    code = str(raised.value.response["Error"]["Code"])
    # A refusal with no XML body (moto's DeleteObject) carries only the HTTP status.
    return "AccessDenied" if code == "403" else code


def test_only_statements_moto_cannot_evaluate_were_left_out(as_writer: WriterSession) -> None:
    # Both are asserted on the template instead (test_artifacts_template).
    assert sorted(as_writer.provisioned.store.skipped_statements) == ["HistoryIsCreateOnly", "aws:SecureTransport"]
    assert set(UNEVALUABLE_CONDITION_KEYS) == {"aws:SecureTransport", "s3:if-none-match"}


def test_writer_can_create_and_read_back_under_experiments(as_writer: WriterSession) -> None:
    s3 = as_writer.client("s3")
    s3.put_object(Bucket=as_writer.bucket, Key=EVENTS_KEY, Body=b'{"step": 0}\n', IfNoneMatch="*")
    assert s3.get_object(Bucket=as_writer.bucket, Key=EVENTS_KEY)["Body"].read() == b'{"step": 0}\n'
    listed = s3.list_objects_v2(Bucket=as_writer.bucket, Prefix=contract.run_prefix("exp-1", "run-1"))
    assert [o["Key"] for o in listed["Contents"]] == [EVENTS_KEY]


def test_a_second_conditional_create_of_the_same_key_is_refused(as_writer: WriterSession) -> None:
    s3 = as_writer.client("s3")
    s3.put_object(Bucket=as_writer.bucket, Key=EVENTS_KEY, Body=b"first", IfNoneMatch="*")
    code = error_code(s3.put_object, Bucket=as_writer.bucket, Key=EVENTS_KEY, Body=b"second", IfNoneMatch="*")
    assert code == "PreconditionFailed"
    assert s3.get_object(Bucket=as_writer.bucket, Key=EVENTS_KEY)["Body"].read() == b"first"


def test_writer_cannot_put_outside_the_experiments_prefix(as_writer: WriterSession) -> None:
    s3 = as_writer.client("s3")
    assert error_code(s3.put_object, Bucket=as_writer.bucket, Key="elsewhere/x", Body=b"x") == "AccessDenied"


def test_writer_cannot_delete_objects_or_versions(as_writer: WriterSession) -> None:
    s3 = as_writer.client("s3")
    version = s3.put_object(Bucket=as_writer.bucket, Key=EVENTS_KEY, Body=b"x", IfNoneMatch="*")["VersionId"]
    assert error_code(s3.delete_object, Bucket=as_writer.bucket, Key=EVENTS_KEY) == "AccessDenied"
    assert error_code(s3.delete_object, Bucket=as_writer.bucket, Key=EVENTS_KEY, VersionId=version) == "AccessDenied"
    assert s3.get_object(Bucket=as_writer.bucket, Key=EVENTS_KEY)["Body"].read() == b"x"


def test_writer_can_put_metrics_in_beacons_namespace(as_writer: WriterSession) -> None:
    datum = [{"MetricName": contract.HEARTBEAT.name, "Value": 1.0}]
    as_writer.client("cloudwatch").put_metric_data(Namespace=contract.metric_namespace("demo"), MetricData=datum)


def test_writer_cannot_read_other_services(as_writer: WriterSession) -> None:
    assert error_code(as_writer.client("iam").list_roles) == "AccessDenied"
