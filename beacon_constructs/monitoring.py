"""Monitoring: alarms that tell a silent job from a stalled one, a dashboard, and the SNS topic.

Team-wide alarms (delivery, restarts) live in the template. Per-run alarms (silent, stalled and
the "metrics lost" composite) would sit in ALARM whenever no job runs, so they are not created
here: the stack publishes their definitions as a template in SSM, and each job instantiates them
for its run after preflight and deletes them on a clean exit.
"""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import ArnFormat, Aws, Duration, Stack
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_ssm as ssm
from beacon import contract
from beacon.contract import Metric, RunAlarm, TeamAlarm
from beacon.contract.pace import (
    RUN_SLOWED_FOR_S,
    RUN_SLOWED_RATIO,
    RUN_SLOWED_SUSTAINED_S,
    SLOW_RANK_FOR_S,
    SLOW_RANK_FOR_STEPS,
    SLOW_RANK_SHARE,
    SLOW_RANK_SUSTAINED_S,
    STALL_FLOOR_S,
    STALL_STEPS,
)
from constructs import Construct

from beacon_constructs.nag import acknowledge, nag_arn
from beacon_constructs.tagging import tag_component

FIRST_CHECKS = (
    "1. Job status: kubectl -n training get jobs,pods (or the SageMaker job's status): running, restarted, evicted?",
    "2. Container log, first 20 s: timeouts or 'connection refused' mean the endpoint or network is wrong.",
    "3. Bucket write permission and volume mount: the preflight record under the run prefix, and the PVC.",
)


def runbook(meaning: str, doctor: str) -> str:
    return "\n".join([meaning, "First checks:", *FIRST_CHECKS, f"Then run: {doctor}"])


def failed_pods_query(cluster_name: str) -> str:
    """Metrics Insights over the per-pod series Container Insights publishes: the most failed pods
    in the training namespace at any time of the period (one series, so an alarm can use it)."""
    dimensions = ", ".join(contract.CONTAINER_INSIGHTS_POD_DIMENSIONS)
    return (
        f'SELECT MAX({contract.CONTAINER_FAILED_PODS}) FROM SCHEMA("{contract.CONTAINER_INSIGHTS_NAMESPACE}", '
        f"{dimensions}) WHERE ClusterName = '{cluster_name}' AND Namespace = '{contract.TRAINING_NAMESPACE}'"
    )


def doctor_command(team: str, *, run_scoped: bool) -> str:
    run = f" --experiment {contract.EXPERIMENT_PLACEHOLDER} --run {contract.RUN_PLACEHOLDER}" if run_scoped else ""
    return f"beacon doctor --team {team}{run}"


class TrainingMonitoring(Construct):
    """Alarms, dashboard and topic for one team's training jobs."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        team: str,
        cluster_name: str,
        alarm_emails: list[str],
        alarm_topic_arns: list[str],
        slow_rank_share: float = SLOW_RANK_SHARE,
    ) -> None:
        super().__init__(scope, construct_id)
        tag_component(self, "monitoring")
        self.team = team
        self.slow_rank_share = slow_rank_share  # the team file's: its runs' slow alarm and their doctor read it
        self.namespace = contract.metric_namespace(team)

        self.topic_key = kms.Key(self, "TopicKey", description=f"Beacon {team}: alarm topic", enable_key_rotation=True)
        self.topic = sns.Topic(
            self, "AlarmTopic", display_name=f"Beacon {team} alarms", master_key=self.topic_key, enforce_ssl=True
        )
        self._admit_cloudwatch_alarms()
        for email in alarm_emails:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))
        # Existing topics (a chat webhook, a pager) get every notification too: an SNS topic cannot
        # subscribe to another, so each alarm action names them.
        self.extra_topic_arns = list(alarm_topic_arns)
        self.notify_topics = [self.topic] + [
            sns.Topic.from_topic_arn(self, f"NotifyTopic{index}", arn) for index, arn in enumerate(alarm_topic_arns)
        ]

        self.upload_failures_alarm = self._team_alarm(
            TeamAlarm.UPLOAD_FAILURES,
            metric=self._team_metric(contract.UPLOAD_FAILURES, "Sum"),
            threshold=1,
            comparison=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            meaning="Uploads to S3 are failing after every retry: records wait in the spool and may be lost "
            "if the pod's volume goes away. Training itself may be fine.",
        )
        self.spool_backlog_alarm = self._team_alarm(
            TeamAlarm.SPOOL_BACKLOG,
            metric=self._team_metric(contract.SPOOL_BACKLOG, "Maximum"),
            threshold=contract.BACKLOG_THRESHOLD_RECORDS,
            comparison=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            meaning=f"More than {contract.BACKLOG_THRESHOLD_RECORDS} records are not yet acknowledged by S3: "
            "delivery is slower than training (a far endpoint, throttling, or no route to S3).",
        )
        self.restarts_alarm = cw.Alarm(
            self,
            "RestartsAlarm",
            alarm_name=contract.team_alarm_name(team, TeamAlarm.RESTARTS),
            alarm_description=runbook(
                f"A pod in the '{contract.TRAINING_NAMESPACE}' namespace failed: the Job replaces it (a restart "
                "of the job), which loses its in-memory state and can hide the cause.",
                doctor_command(team, run_scoped=False),
            ),
            metric=cw.MathExpression(
                expression=failed_pods_query(cluster_name),
                label="failed pods",
                period=Duration.seconds(contract.RESTARTS_PERIOD_S),
            ),
            threshold=1,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )
        for topic in self.notify_topics:
            self.restarts_alarm.add_alarm_action(cw_actions.SnsAction(topic))
            self.restarts_alarm.add_ok_action(cw_actions.SnsAction(topic))
        self.team_alarms = (self.upload_failures_alarm, self.spool_backlog_alarm, self.restarts_alarm)

        self.run_alarm_template = self._run_alarm_template()
        self.run_alarm_parameter = ssm.StringParameter(
            self,
            "RunAlarmTemplate",
            parameter_name=contract.run_alarm_parameter_name(team),
            description="Beacon per-run alarms; each job fills in ${Experiment} and ${Run}",
            string_value=json.dumps(self.run_alarm_template, sort_keys=True),
            tier=ssm.ParameterTier.ADVANCED,  # the runbook descriptions exceed the standard 4 KB
        )
        self.dashboard = self._dashboard(cluster_name)

    # --- the topic: CloudWatch must be let in ------------------------------------------
    def _alarm_arn(self, name: str) -> str:
        return Stack.of(self).format_arn(
            service="cloudwatch", resource="alarm", resource_name=name, arn_format=ArnFormat.COLON_RESOURCE_NAME
        )

    @property
    def own_alarm_arns(self) -> list[str]:
        """This team's alarms, team-wide and per run; nothing another team can name."""
        team_alarms = [contract.team_alarm_name(self.team, kind) for kind in contract.TeamAlarm]
        return [self._alarm_arn(name) for name in (*team_alarms, f"{contract.run_alarm_prefix(self.team)}*")]

    def _admit_cloudwatch_alarms(self) -> None:
        # enforce_ssl leaves the topic a policy with a Deny only, which replaces SNS's default one:
        # without these statements CloudWatch may neither publish nor use the topic's key.
        cloudwatch = iam.ServicePrincipal("cloudwatch.amazonaws.com")
        on_behalf_of_own_alarms = {
            "ArnLike": {"aws:SourceArn": self.own_alarm_arns},
            "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
        }
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarmsPublish",
                actions=["sns:Publish"],
                principals=[cloudwatch],
                resources=[self.topic.topic_arn],
                conditions=on_behalf_of_own_alarms,
            )
        )
        self.topic_key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarmsUseKey",
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                principals=[cloudwatch],
                resources=["*"],
                conditions=on_behalf_of_own_alarms,
            )
        )

    # --- team alarms ------------------------------------------------------------------
    def _team_metric(self, metric: Metric, statistic: str) -> cw.Metric:
        return cw.Metric(
            namespace=self.namespace,
            metric_name=metric.name,
            dimensions_map=contract.team_dimensions(self.team),
            statistic=statistic,
            period=Duration.seconds(contract.DELIVERY_PERIOD_S),
        )

    def _team_alarm(
        self, kind: TeamAlarm, *, metric: cw.Metric, threshold: float, comparison: cw.ComparisonOperator, meaning: str
    ) -> cw.Alarm:
        # No actions of their own: each run's "metrics lost" composite notifies, once.
        return cw.Alarm(
            self,
            f"{kind.value.title().replace('-', '')}Alarm",
            alarm_name=contract.team_alarm_name(self.team, kind),
            alarm_description=runbook(meaning, doctor_command(self.team, run_scoped=False)),
            metric=metric,
            threshold=threshold,
            comparison_operator=comparison,
            evaluation_periods=contract.DELIVERY_EVALUATION_PERIODS,
            datapoints_to_alarm=contract.DELIVERY_DATAPOINTS_TO_ALARM,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )

    # --- per-run alarms (a template the job instantiates) ------------------------------
    def _run_alarm_name(self, kind: RunAlarm) -> str:
        return contract.run_alarm_name(self.team, contract.EXPERIMENT_PLACEHOLDER, contract.RUN_PLACEHOLDER, kind)

    def _run_metric_alarm(self, kind: RunAlarm, metric: Metric, meaning: str, **shape: Any) -> dict[str, Any]:
        dimensions = contract.run_dimensions(self.team, contract.EXPERIMENT_PLACEHOLDER, contract.RUN_PLACEHOLDER)
        return {
            "AlarmName": self._run_alarm_name(kind),
            "AlarmDescription": runbook(meaning, doctor_command(self.team, run_scoped=True)),
            "ActionsEnabled": False,  # the composite notifies
            "Namespace": self.namespace,
            "MetricName": metric.name,
            "Dimensions": [{"Name": k, "Value": v} for k, v in dimensions.items()],
            "Period": contract.HEARTBEAT_PERIOD_S,
            **shape,
        }

    def _sustained_alarm(
        self, kind: RunAlarm, metric: Metric, meaning: str, *, at_least: float, span_s: float
    ) -> dict[str, Any]:
        """A run's alarm on `contract.pace.sustained`'s rule: every period of `span_s` at `at_least` or more. It
        notifies the team's topic itself, not through the composite (`RunAlarm.notifying`): a run may be slow for
        hours, and a composite notifies once. No datum (a rank stalled, no baseline yet, no run.watch): the state
        stays, so a slow run that hangs sends no "OK" while its stalled alarm is counting."""
        periods = int(span_s // contract.HEARTBEAT_PERIOD_S)
        alarm = self._run_metric_alarm(
            kind,
            metric,
            meaning,
            Statistic="Minimum",
            Threshold=at_least,
            ComparisonOperator="GreaterThanOrEqualToThreshold",
            EvaluationPeriods=periods,
            DatapointsToAlarm=periods,
            TreatMissingData="ignore",
        )
        return alarm | {"ActionsEnabled": True, "AlarmActions": self._topics(), "OKActions": self._topics()}

    def _run_alarm_template(self) -> dict[str, Any]:
        silent = self._run_metric_alarm(
            RunAlarm.SILENT,
            contract.HEARTBEAT,
            f"The job's heartbeat has stopped for {contract.SILENT_BUDGET_S} s: the process is frozen, killed, "
            "or cannot reach CloudWatch. Its metrics are not arriving.",
            Statistic="SampleCount",
            Threshold=1,
            ComparisonOperator="LessThanThreshold",
            EvaluationPeriods=contract.SILENT_EVALUATION_PERIODS,
            DatapointsToAlarm=contract.SILENT_EVALUATION_PERIODS,
            TreatMissingData="breaching",
        )
        stalled = self._run_metric_alarm(
            RunAlarm.STALLED,
            contract.STALL_RATIO,
            "The job is alive (heartbeat arrives) but no training step has finished, outside named phases, for the "
            f"run's stall threshold (its stall_dump_after, {contract.STALL_THRESHOLD_S} s by default, or "
            f"{STALL_STEPS} of its slowest steps once it has a pace, at least {STALL_FLOOR_S:.0f} s): a hung "
            "DataLoader worker, a collective waiting on a dead rank, "
            "a deadlock, or a pause the loop did not wrap in run.phase (the doctor tells which).",
            Statistic="Maximum",
            Threshold=1,
            ComparisonOperator="GreaterThanOrEqualToThreshold",
            EvaluationPeriods=contract.STALLED_EVALUATION_PERIODS,
            DatapointsToAlarm=contract.STALLED_EVALUATION_PERIODS,
            TreatMissingData="notBreaching",  # no heartbeat at all is the silent alarm's case
        )
        slow = self._sustained_alarm(
            RunAlarm.SLOW,
            contract.STRAGGLER_WAIT_SHARE,
            f"The ranks step together at the pace of one of them: the others wait for it {self.slow_rank_share:.0%} of "
            f"each step or more, over {SLOW_RANK_FOR_S:.0f} s and {SLOW_RANK_FOR_STEPS} steps (a throttled GPU, a "
            "flaky NIC, a noisy neighbour). Sent only by a job whose loop calls run.watch.",
            at_least=self.slow_rank_share,
            span_s=SLOW_RANK_SUSTAINED_S,
        )
        slowed = self._sustained_alarm(
            RunAlarm.SLOWED,
            contract.STEP_TIME_RATIO,
            f"The run's steps take {RUN_SLOWED_RATIO}x its own baseline or more, every rank alike, for "
            f"{RUN_SLOWED_FOR_S / 60:.0f} minutes (its data, storage or network: what every rank shares). The "
            "baseline is the median of its first full window after warm-up.",
            at_least=RUN_SLOWED_RATIO,
            span_s=RUN_SLOWED_SUSTAINED_S,
        )
        members = [silent["AlarmName"], stalled["AlarmName"]] + [
            contract.team_alarm_name(self.team, kind) for kind in (TeamAlarm.UPLOAD_FAILURES, TeamAlarm.SPOOL_BACKLOG)
        ]
        composite = {
            "AlarmName": self._run_alarm_name(RunAlarm.METRICS_LOST),
            "AlarmDescription": runbook(
                "This run's metrics are being lost: it is silent, stalled, or cannot deliver to S3.",
                doctor_command(self.team, run_scoped=True),
            ),
            "AlarmRule": " OR ".join(f'ALARM("{name}")' for name in members),
            "ActionsEnabled": True,
            "AlarmActions": self._topics(),
            "OKActions": self._topics(),
        }
        return {"metric_alarms": [silent, stalled, slow, slowed], "composite_alarm": composite}

    def _topics(self) -> list[str]:
        return [self.topic.topic_arn, *self.extra_topic_arns]

    def grant_run_alarms(self, grantee: iam.IRole) -> iam.Policy:
        """Let a job read the template and create or delete its own run's alarms, and no others;
        an alarm it creates may notify this team's topic only."""
        run_alarm_pattern = f"{contract.run_alarm_prefix(self.team)}*"
        alarm_arn = self._alarm_arn(run_alarm_pattern)
        policy = iam.Policy(
            self,
            "RunAlarmsPolicy",
            roles=[grantee],
            statements=[
                iam.PolicyStatement(
                    sid="ManageOwnRunAlarms",
                    actions=["cloudwatch:PutMetricAlarm", "cloudwatch:PutCompositeAlarm"],
                    resources=[alarm_arn],
                    conditions={
                        "ForAllValues:StringEquals": {
                            "cloudwatch:AlarmActions": [self.topic.topic_arn, *self.extra_topic_arns]
                        }
                    },
                ),
                iam.PolicyStatement(
                    sid="DeleteOwnRunAlarms",
                    actions=["cloudwatch:DeleteAlarms"],
                    resources=[alarm_arn],
                ),
                iam.PolicyStatement(
                    sid="ReadRunAlarmTemplate",
                    actions=["ssm:GetParameter"],
                    resources=[self.run_alarm_parameter.parameter_arn],
                ),
            ],
        )
        acknowledge(
            policy,
            f"IAM5[Resource::{nag_arn(Stack.of(self), 'cloudwatch', 'alarm', run_alarm_pattern)}]",
            "Run ids are chosen at job start; the grant is limited to this team's run-alarm name prefix.",
        )
        return policy

    # --- dashboard ----------------------------------------------------------------------
    def _search(
        self,
        metric: Metric,
        statistic: str,
        period: int,
        label: str,
        dimensions: tuple[contract.Dim, ...] = contract.RUN_DIMENSIONS,
    ) -> cw.MathExpression:
        dims = ",".join(d.value for d in dimensions)
        query = (
            f'SEARCH(\'{{{self.namespace},{dims}}} MetricName="{metric.name}" '
            f"{contract.Dim.TEAM.value}=\"{self.team}\"', '{statistic}', {period})"
        )
        return cw.MathExpression(expression=query, label=label, period=Duration.seconds(period))

    def _dashboard(self, cluster_name: str) -> cw.Dashboard:
        dashboard = cw.Dashboard(self, "Dashboard", dashboard_name=f"beacon-{self.team}")
        period = contract.HEARTBEAT_PERIOD_S
        stall_threshold = cw.HorizontalAnnotation(
            value=contract.STALL_THRESHOLD_S, label="stall threshold (sooner at a fast run's pace)"
        )
        dashboard.add_widgets(
            cw.TextWidget(
                markdown="\n".join(
                    [
                        f"# Beacon — {self.team}",
                        "Metrics missing? Run `" + doctor_command(self.team, run_scoped=False) + " --run <run>`.",
                        "",
                        *FIRST_CHECKS,
                    ]
                ),
                width=24,
                height=4,
            ),
            cw.AlarmStatusWidget(alarms=list(self.team_alarms), title="Team alarms", width=24, height=2),
        )
        dashboard.add_widgets(
            cw.GraphWidget(title="Loss per run", left=[self._search(contract.LOSS, "Average", 60, "")], width=12),
            cw.GraphWidget(
                title="Steps per second per run",
                left=[self._search(contract.STEPS_PER_SECOND, "Average", 60, "")],
                width=12,
            ),
        )
        dashboard.add_widgets(
            cw.GraphWidget(
                title="Heartbeats per 30 s (none for 120 s = silent)",
                left=[self._search(contract.HEARTBEAT, "SampleCount", period, "")],
                left_annotations=[cw.HorizontalAnnotation(value=1, label="at least one beat")],
                width=12,
            ),
            cw.GraphWidget(
                title="Progress age, s (named phases excluded); over the run's stall threshold (right)",
                left=[self._search(contract.PROGRESS_AGE, "Maximum", period, "")],
                left_annotations=[stall_threshold],
                right=[self._search(contract.STALL_RATIO, "Maximum", period, "")],
                right_annotations=[cw.HorizontalAnnotation(value=1, label="stalled")],
                width=12,
            ),
        )
        dashboard.add_widgets(
            cw.GraphWidget(
                title="Upload latency (ms) and failures",
                left=[self._search(contract.UPLOAD_LATENCY, "Average", 60, "")],
                right=[self._search(contract.UPLOAD_FAILURES, "Sum", 60, "")],
                width=8,
            ),
            cw.GraphWidget(
                title="Spool backlog (records not yet in S3)",
                left=[self._search(contract.SPOOL_BACKLOG, "Maximum", 60, "")],
                left_annotations=[cw.HorizontalAnnotation(value=contract.BACKLOG_THRESHOLD_RECORDS, label="alarm")],
                width=8,
            ),
            cw.GraphWidget(
                title="Checkpoint duration, s; skipped checkpoints and the steps a crash would redo (right)",
                left=[self._search(contract.CHECKPOINT_SECONDS, "Maximum", 60, "")],
                right=[
                    self._search(contract.CHECKPOINTS_SKIPPED, "Sum", 60, ""),
                    self._search(contract.STEPS_SINCE_CHECKPOINT, "Maximum", 60, ""),
                ],
                width=8,
            ),
        )
        dashboard.add_widgets(
            cw.GraphWidget(
                title="Time in setup, evaluation or checkpoint, s (not a stall)",
                left=[
                    self._search(
                        contract.PHASE_SECONDS, "Maximum", period, "", (*contract.RUN_DIMENSIONS, contract.Dim.PHASE)
                    )
                ],
                width=12,
            ),
            cw.GraphWidget(
                title="NaN or infinite loss values (the job runs on; the loss diverged)",
                left=[self._search(contract.NON_FINITE_LOSS, "Sum", 60, "")],
                width=12,
            ),
        )
        dashboard.add_widgets(
            cw.GraphWidget(
                title="Slowest rank's progress age, s (multi-rank jobs; `beacon doctor` names the rank)",
                left=[self._search(contract.SLOWEST_RANK_PROGRESS_AGE, "Maximum", period, "")],
                left_annotations=[stall_threshold],
                width=12,
            ),
            cw.GraphWidget(
                title="Steps between the furthest and the least advanced rank",
                left=[self._search(contract.RANK_STEP_SPREAD, "Maximum", period, "")],
                width=12,
            ),
        )
        dashboard.add_widgets(
            cw.GraphWidget(
                title="Share of each step the ranks wait for the slowest (run.watch; `beacon doctor` names it)",
                left=[self._search(contract.STRAGGLER_WAIT_SHARE, "Maximum", period, "")],
                left_annotations=[cw.HorizontalAnnotation(value=self.slow_rank_share, label="slow")],
                width=12,
            ),
            cw.GraphWidget(
                title="The run's step time over its own baseline (every rank alike)",
                left=[self._search(contract.STEP_TIME_RATIO, "Minimum", period, "")],
                left_annotations=[cw.HorizontalAnnotation(value=RUN_SLOWED_RATIO, label="slowed")],
                width=12,
            ),
        )
        dashboard.add_widgets(
            cw.GraphWidget(
                title="Failed pods (training namespace; the Job replaces each)",
                left=[self.restarts_alarm.metric],
                width=24,
            ),
        )  # No GPU utilisation: one DCGM host engine per GPU node, the node monitoring agent's (cluster.py)
        return dashboard
