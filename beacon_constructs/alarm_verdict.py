"""The alarm carries the verdict: a run's metrics-lost alarm goes to ALARM, an EventBridge rule hands the
state change to a small function, and the function publishes the doctor's verdict on that run to the team's
topic (`beacon_ops.doctor.notify`).

No loop: the rule matches the team's metrics-lost alarms going to ALARM, and the function only publishes.
It reads the alarmed run's evidence, in a session of the artifact store's verdict reader role whose policy
names that run alone, and publishes to the one topic; nothing else (no write, no delete, no other run, no
other topic, no other bucket, no Kubernetes API).

Packaged without Docker: at synth the bundle's sources are copied into a staging directory under the
app's output directory, and that directory is the function's asset. Lambda's Python runtime brings boto3.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from aws_cdk import Aws, Duration, Stack, Stage
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from beacon import contract
from constructs import Construct

from beacon_constructs.log_groups import log_group
from beacon_constructs.nag import acknowledge, nag_arn
from beacon_constructs.tagging import tag_component

ROOT = Path(__file__).resolve().parent.parent
# (source in the repository, path in the bundle): of the runtime its contract wing alone (and the package file,
# whose names load on first use), since readers import nothing else of it; of the operator its ground floor's
# package file, the doctor (with the handler) and the one reading of a run.
BUNDLE = (
    ("runtime/beacon/__init__.py", "beacon/__init__.py"),
    ("runtime/beacon/contract", "beacon/contract"),
    ("beacon_ops/__init__.py", "beacon_ops/__init__.py"),
    ("beacon_ops/doctor", "beacon_ops/doctor"),
    ("beacon_ops/evidence/__init__.py", "beacon_ops/evidence/__init__.py"),
    ("beacon_ops/evidence/reading.py", "beacon_ops/evidence/reading.py"),
)
HANDLER = "beacon_ops.doctor.notify.handler"
# The function's environment (beacon_ops.doctor.notify reads the same names).
ENV_TEAM, ENV_BUCKET, ENV_TOPIC_ARN = "BEACON_TEAM", "BEACON_BUCKET", "BEACON_TOPIC_ARN"
ENV_READER_ROLE_ARN = "BEACON_READER_ROLE_ARN"
ENV_PRICES = "BEACON_PRICES"
STATE_CHANGE = "CloudWatch Alarm State Change"
# The diagnosis takes seconds; a run of several ranks whose evidence is still on its way is read again for up
# to `notify.RANK_EVIDENCE_WAIT_S` (150 s), which the function's time must cover with room to publish.
TIMEOUT_S = 240


def stage_bundle(destination: Path) -> Path:
    """Copy the function's sources into `destination` (emptied first); the bundle's root."""
    if destination.exists():
        shutil.rmtree(destination)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for source, target in BUNDLE:
        path, into = ROOT / source, destination / target
        if path.is_dir():
            shutil.copytree(path, into, ignore=ignore)
        else:
            into.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, into)
    return destination


def notifying_patterns(team: str) -> list[str]:
    """Every run's notifying alarms of this team (metrics-lost, slow, slowed), as EventBridge wildcards."""
    return [f"{contract.run_alarm_prefix(team)}*-{kind.value}" for kind in contract.RunAlarm.notifying()]


class AlarmVerdict(Construct):
    """An EventBridge rule on the team's metrics-lost alarms going to ALARM, and the function it invokes."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        team: str,
        topic: sns.ITopic,
        topic_key: kms.IKey,
        bucket: s3.IBucket,
        role: iam.IRole,
        reader_role: iam.IRole,
        alarm_arns: list[str],
        log_retention_days: int,
        prices: dict[str, dict[str, float]] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        tag_component(self, "alarm-verdict")
        stack = Stack.of(self)
        self.logs = log_group(self, "Logs", retention_days=log_retention_days)
        self.role = role
        self.policy = iam.Policy(
            self,
            "Policy",
            roles=[role],
            statements=[
                iam.PolicyStatement(
                    sid="ReadRunMetrics",
                    actions=["cloudwatch:GetMetricStatistics"],
                    resources=["*"],  # no resource type
                ),
                iam.PolicyStatement(
                    sid="DescribeTeamAlarms", actions=["cloudwatch:DescribeAlarms"], resources=alarm_arns
                ),
                iam.PolicyStatement(sid="PublishVerdict", actions=["sns:Publish"], resources=[topic.topic_arn]),
                iam.PolicyStatement(
                    sid="EncryptVerdictViaSns",
                    actions=["kms:GenerateDataKey", "kms:Decrypt"],
                    resources=[topic_key.key_arn],
                    conditions={"StringEquals": {"kms:ViaService": f"sns.{Aws.REGION}.amazonaws.com"}},
                ),
                iam.PolicyStatement(
                    sid="WriteOwnLogs",
                    actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                    resources=[self.logs.log_group_arn],
                ),
            ],
        )
        stage = Stage.of(self)
        assert stage is not None, "a construct in an app"
        staged = stage_bundle(Path(stage.outdir) / ".bundles" / f"{stack.stack_name}-alarm-verdict")
        self.function = lambda_.Function(
            self,
            "Function",
            description=f"Beacon {team}: the doctor's verdict on a run whose metrics-lost alarm fired",
            runtime=lambda_.Runtime.PYTHON_3_14,
            architecture=lambda_.Architecture.ARM_64,
            handler=HANDLER,
            code=lambda_.Code.from_asset(str(staged)),
            role=role,
            log_group=self.logs,
            memory_size=256,
            timeout=Duration.seconds(TIMEOUT_S),
            environment={
                ENV_TEAM: team,
                ENV_BUCKET: bucket.bucket_name,
                ENV_TOPIC_ARN: topic.topic_arn,
                ENV_READER_ROLE_ARN: reader_role.role_arn,  # taken per alarm, scoped to the alarmed run
                # the team file's own prices, for the verdict's cost (none: the list prices)
                ENV_PRICES: json.dumps(prices or {}, sort_keys=True),
            },
        )
        self.function.node.add_dependency(self.policy)
        self.rule = events.Rule(
            self,
            "MetricsLost",
            description=f"Beacon {team}: a run's metrics-lost alarm went to ALARM",
            event_pattern=events.EventPattern(
                source=["aws.cloudwatch"],
                detail_type=[STATE_CHANGE],
                detail={
                    "alarmName": events.Match.any_of(*map(events.Match.wildcard, notifying_patterns(team))),
                    "state": {"value": ["ALARM"]},
                },
            ),
            targets=[targets.LambdaFunction(self.function, retry_attempts=2, max_event_age=Duration.hours(1))],
        )
        acknowledge(
            self.policy,
            "IAM5[Resource::*]",
            "cloudwatch:GetMetricStatistics has no resource type; the function only reads the run's metrics.",
        )
        acknowledge(
            self.policy,
            f"IAM5[Resource::{nag_arn(stack, 'cloudwatch', 'alarm', f'{contract.run_alarm_prefix(team)}*')}]",
            "Run ids are chosen at job start; the function describes this team's run alarms only, by name prefix.",
        )
