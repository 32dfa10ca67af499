"""The job arms and disarms its own run alarms in moto, as the writer, with IAM enforced.

moto stores alarms (it never evaluates them: see test_alarm_evaluator for that). What this proves
is that the synthesized template instantiates into valid PutMetricAlarm/PutCompositeAlarm calls,
that the writer's grant allows it, and that a clean exit leaves no run alarm behind. moto checks
CloudWatch and SSM calls against the resource "*" only, so the grant's name-prefix scoping is
asserted on the template (test_monitoring_template), not here.
"""

from __future__ import annotations

from typing import Any

import pytest

from beacon.embedded import provision_artifact_store, provision_monitoring
from tests.moto_server import ACCOUNT, REGION, MotoServer
from tests.synth import Synthesized
from training import contract
from training.run_alarms import RunAlarms


@pytest.fixture
def as_writer(demo: Synthesized, moto_server: MotoServer) -> dict[str, Any]:
    iam = moto_server.client("iam")
    operator = iam.create_user(UserName="beacon-operator")["User"]
    iam.put_user_policy(
        UserName="beacon-operator",
        PolicyName="assume",
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
        bucket_name="beacon-demo-alarms-test",
        trusted_principal_arn=operator["Arn"],
    )
    provision_monitoring(
        demo.template("monitoring"),
        cloudwatch=moto_server.client("cloudwatch"),
        ssm=moto_server.client("ssm"),
        sns=moto_server.client("sns"),
        iam=iam,
        account=ACCOUNT,
        region=REGION,
        writer_role_name=store.writer_role_arn.rsplit("/", 1)[1],
    )
    moto_server.enforce_iam()
    sts = moto_server.client(
        "sts", aws_access_key_id=keys["AccessKeyId"], aws_secret_access_key=keys["SecretAccessKey"]
    )
    creds = sts.assume_role(RoleArn=store.writer_role_arn, RoleSessionName="job")["Credentials"]
    return {
        "aws_access_key_id": creds["AccessKeyId"],
        "aws_secret_access_key": creds["SecretAccessKey"],
        "aws_session_token": creds["SessionToken"],
    }


def test_team_alarms_exist_after_provisioning_and_no_run_alarm_does(demo: Synthesized, moto_server: MotoServer) -> None:
    iam = moto_server.client("iam")
    iam.create_role(RoleName="writer", AssumeRolePolicyDocument='{"Version":"2012-10-17","Statement":[]}')
    provision_monitoring(
        demo.template("monitoring"),
        cloudwatch=moto_server.client("cloudwatch"),
        ssm=moto_server.client("ssm"),
        sns=moto_server.client("sns"),
        iam=iam,
        account=ACCOUNT,
        region=REGION,
        writer_role_name="writer",
    )
    alarms = moto_server.client("cloudwatch").describe_alarms()
    names = sorted(a["AlarmName"] for a in alarms["MetricAlarms"])
    assert names == sorted(contract.team_alarm_name("demo", k) for k in contract.TeamAlarm)
    assert not [n for n in names if n.startswith(contract.run_alarm_prefix("demo"))]


def test_the_writer_arms_its_run_alarms_from_the_template_and_disarms_them_on_exit(
    as_writer: dict[str, Any], moto_server: MotoServer
) -> None:
    cloudwatch = moto_server.client("cloudwatch", **as_writer)
    alarms = RunAlarms(cloudwatch, moto_server.client("ssm", **as_writer), "demo", "exp-1", "run-1")
    alarms.arm()
    admin = moto_server.client("cloudwatch", aws_access_key_id="admin", aws_secret_access_key="admin")
    moto_server.reset_auth_only()
    described = admin.describe_alarms(AlarmNamePrefix=contract.run_alarm_prefix("demo"))
    metric_names = sorted(a["AlarmName"] for a in described["MetricAlarms"])
    assert metric_names == sorted(n for n in alarms.names() if not n.endswith("metrics-lost"))
    silent = next(a for a in described["MetricAlarms"] if a["AlarmName"].endswith("-silent"))
    assert {d["Name"]: d["Value"] for d in silent["Dimensions"]} == {
        "Team": "demo",
        "Experiment": "exp-1",
        "Run": "run-1",
    }
    assert [a["AlarmName"] for a in described["CompositeAlarms"]] == [
        contract.run_alarm_name("demo", "exp-1", "run-1", contract.RunAlarm.METRICS_LOST)
    ]
    moto_server.enforce_iam()
    alarms.disarm()
    moto_server.reset_auth_only()
    left = admin.describe_alarms(AlarmNamePrefix=contract.run_alarm_prefix("demo"))
    assert left["MetricAlarms"] == [] and left["CompositeAlarms"] == []
