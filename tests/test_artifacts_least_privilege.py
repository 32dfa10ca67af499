"""Least privilege, for real: the synthesized writer policy and bucket policy, deployed into moto
with IAM enforcement on, then exercised as the writer.

moto does not evaluate the condition keys s3:prefix, cloudwatch:namespace, s3:if-none-match or
aws:SecureTransport; the statements that use them are asserted on the template
(test_artifacts_template), and the If-None-Match header's own behaviour is proven here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from botocore.exceptions import ClientError

from beacon.embedded import UNEVALUABLE_CONDITION_KEYS, ArtifactStoreHandles, provision_artifact_store
from tests.moto_server import ACCOUNT, REGION, MotoServer
from tests.synth import Synthesized
from training import contract

BUCKET = "beacon-demo-artifacts-test"


@dataclass
class Writer:
    store: ArtifactStoreHandles
    s3: Any
    cloudwatch: Any


@pytest.fixture
def writer(demo: Synthesized, moto_server: MotoServer) -> Iterator[Writer]:
    iam = moto_server.client("iam")
    operator = iam.create_user(UserName="beacon-operator")["User"]
    iam.put_user_policy(
        UserName="beacon-operator",
        PolicyName="assume-beacon-roles",
        PolicyDocument='{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"sts:AssumeRole","Resource":"*"}]}',
    )
    keys = iam.create_access_key(UserName="beacon-operator")["AccessKey"]
    store = provision_artifact_store(
        demo.template("artifacts"),
        s3=moto_server.client("s3"),
        kms=moto_server.client("kms"),
        iam=iam,
        account=ACCOUNT,
        region=REGION,
        bucket_name=BUCKET,
        trusted_principal_arn=operator["Arn"],
    )
    moto_server.enforce_iam()
    sts = moto_server.client(
        "sts", aws_access_key_id=keys["AccessKeyId"], aws_secret_access_key=keys["SecretAccessKey"]
    )
    creds = sts.assume_role(RoleArn=store.writer_role_arn, RoleSessionName="smoke")["Credentials"]
    session = {
        "aws_access_key_id": creds["AccessKeyId"],
        "aws_secret_access_key": creds["SecretAccessKey"],
        "aws_session_token": creds["SessionToken"],
    }
    yield Writer(store, moto_server.client("s3", **session), moto_server.client("cloudwatch", **session))


def error_code(call: Any, **kwargs: Any) -> str:
    with pytest.raises(ClientError) as raised:
        call(**kwargs)
    code = str(raised.value.response["Error"]["Code"])
    # A refusal with no XML body (moto's DeleteObject) carries only the HTTP status.
    return "AccessDenied" if code == "403" else code


EVENTS_KEY = contract.events_key("exp-1", "run-1", 0)


def test_only_statements_moto_cannot_evaluate_were_left_out(writer: Writer) -> None:
    # Both are asserted on the template instead (test_artifacts_template).
    assert sorted(writer.store.skipped_statements) == ["HistoryIsCreateOnly", "aws:SecureTransport"]
    assert set(UNEVALUABLE_CONDITION_KEYS) == {"aws:SecureTransport", "s3:if-none-match"}


def test_writer_can_create_and_read_back_under_experiments(writer: Writer) -> None:
    writer.s3.put_object(Bucket=BUCKET, Key=EVENTS_KEY, Body=b'{"step": 0}\n', IfNoneMatch="*")
    assert writer.s3.get_object(Bucket=BUCKET, Key=EVENTS_KEY)["Body"].read() == b'{"step": 0}\n'
    listed = writer.s3.list_objects_v2(Bucket=BUCKET, Prefix=contract.run_prefix("exp-1", "run-1"))
    assert [o["Key"] for o in listed["Contents"]] == [EVENTS_KEY]


def test_a_second_conditional_create_of_the_same_key_is_refused(writer: Writer) -> None:
    writer.s3.put_object(Bucket=BUCKET, Key=EVENTS_KEY, Body=b"first", IfNoneMatch="*")
    code = error_code(writer.s3.put_object, Bucket=BUCKET, Key=EVENTS_KEY, Body=b"second", IfNoneMatch="*")
    assert code == "PreconditionFailed"
    assert writer.s3.get_object(Bucket=BUCKET, Key=EVENTS_KEY)["Body"].read() == b"first"


def test_writer_cannot_put_outside_the_experiments_prefix(writer: Writer) -> None:
    assert error_code(writer.s3.put_object, Bucket=BUCKET, Key="elsewhere/x", Body=b"x") == "AccessDenied"


def test_writer_cannot_delete_objects_or_versions(writer: Writer) -> None:
    version = writer.s3.put_object(Bucket=BUCKET, Key=EVENTS_KEY, Body=b"x", IfNoneMatch="*")["VersionId"]
    assert error_code(writer.s3.delete_object, Bucket=BUCKET, Key=EVENTS_KEY) == "AccessDenied"
    assert error_code(writer.s3.delete_object, Bucket=BUCKET, Key=EVENTS_KEY, VersionId=version) == "AccessDenied"
    assert writer.s3.get_object(Bucket=BUCKET, Key=EVENTS_KEY)["Body"].read() == b"x"


def test_writer_can_put_metrics_in_beacons_namespace(writer: Writer) -> None:
    datum = [{"MetricName": contract.HEARTBEAT.name, "Value": 1.0}]
    writer.cloudwatch.put_metric_data(Namespace=contract.NAMESPACE, MetricData=datum)


def test_writer_cannot_read_other_services(writer: Writer, moto_server: MotoServer) -> None:
    # The writer's session has S3 and CloudWatch rights only; nothing to enumerate IAM with.
    session = writer.s3._request_signer._credentials
    iam = moto_server.client(
        "iam",
        aws_access_key_id=session.access_key,
        aws_secret_access_key=session.secret_key,
        aws_session_token=session.token,
    )
    assert error_code(iam.list_roles) == "AccessDenied"
