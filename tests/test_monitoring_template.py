"""The monitoring stack as synthesized: alarms, their shapes and runbooks, the topic, the dashboard."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Match, Template
from beacon import contract
from beacon.contract.pace import RUN_SLOWED_RATIO, RUN_SLOWED_SUSTAINED_S, SLOW_RANK_SHARE, SLOW_RANK_SUSTAINED_S

from beacon_constructs.monitoring import FIRST_CHECKS, TrainingMonitoring
from beacon_ops.evidence.alarms import (
    ALARM,
    OK,
    MetricAlarm,
    SeriesKey,
    run_alarm_definitions,
    series_key,
    team_alarm_definitions,
)
from beacon_ops.templates import Template as BeaconTemplate
from config import TeamConfig
from tests.support.synth import Synthesized

STACK = "beacon-demo-monitoring"


@pytest.fixture(scope="module")
def template(demo: Synthesized) -> Template:
    return demo.assertions(STACK)


@pytest.fixture(scope="module")
def run_alarms(demo: Synthesized) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    return run_alarm_definitions(demo.template("monitoring"), "exp-1", "run-1")


def by_name(definitions: list[dict[str, Any]], kind: contract.RunAlarm) -> dict[str, Any]:
    name = contract.run_alarm_name("demo", "exp-1", "run-1", kind)
    return next(d for d in definitions if d["AlarmName"] == name)


def assert_runbook(description: str, *, doctor: str) -> None:
    assert "First checks:" in description
    for check in FIRST_CHECKS:
        assert check in description
    assert f"Then run: {doctor}" in description


def test_silent_alarm_counts_heartbeats_per_30s_and_treats_silence_as_breaching(run_alarms: Any) -> None:
    silent = by_name(run_alarms[0], contract.RunAlarm.SILENT)
    assert silent["MetricName"] == contract.HEARTBEAT.name
    assert silent["Namespace"] == contract.metric_namespace("demo") == "Beacon/demo"
    assert {d["Name"]: d["Value"] for d in silent["Dimensions"]} == {
        "Team": "demo",
        "Experiment": "exp-1",
        "Run": "run-1",
    }
    assert (silent["Statistic"], silent["Period"], silent["Threshold"]) == ("SampleCount", 30, 1)
    assert silent["ComparisonOperator"] == "LessThanThreshold"
    assert (silent["EvaluationPeriods"], silent["DatapointsToAlarm"]) == (3, 3)
    assert silent["TreatMissingData"] == "breaching"
    # 30 s periods need high-resolution data.
    assert contract.HEARTBEAT.storage_resolution == 1
    assert silent["Period"] * silent["EvaluationPeriods"] + silent["Period"] <= contract.SILENT_BUDGET_S


def test_stalled_alarm_watches_the_runs_own_threshold_and_ignores_missing_data(run_alarms: Any) -> None:
    """StallRatio is ProgressAge over the run's threshold (`contract.pace`), so one alarm serves 1 s and 60 s steps;
    one period holding a beat past it is enough: the ratio only grows while the loop hangs."""
    stalled = by_name(run_alarms[0], contract.RunAlarm.STALLED)
    assert stalled["MetricName"] == contract.STALL_RATIO.name
    assert (stalled["Statistic"], stalled["Period"], stalled["Threshold"]) == ("Maximum", 30, 1)
    assert stalled["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert (stalled["EvaluationPeriods"], stalled["DatapointsToAlarm"]) == (1, 1)
    assert stalled["TreatMissingData"] == "notBreaching"
    assert contract.STALL_RATIO.storage_resolution == 1


def test_slow_alarm_watches_the_stragglers_wait_share_at_the_contracts_threshold(run_alarms: Any) -> None:
    slow = by_name(run_alarms[0], contract.RunAlarm.SLOW)
    assert slow["MetricName"] == contract.STRAGGLER_WAIT_SHARE.name
    assert (slow["Statistic"], slow["Period"], slow["Threshold"]) == ("Minimum", 30, SLOW_RANK_SHARE)
    assert slow["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    periods = slow["EvaluationPeriods"]
    assert periods == slow["DatapointsToAlarm"] and periods * slow["Period"] == SLOW_RANK_SUSTAINED_S
    assert slow["TreatMissingData"] == "ignore", "no share (no run.watch, a rank stalled): the state stays"


def test_a_teams_slow_rank_share_is_its_slow_alarms_threshold_and_its_dashboards_line() -> None:
    """The team file's monitoring.slow_rank_share (config → stack → here): the alarm its runs create says it too."""
    stack = Stack(App(), "Probe")
    TrainingMonitoring(stack, "Monitoring", team="demo", cluster_name="beacon-demo", alarm_emails=[],
                       alarm_topic_arns=[], slow_rank_share=0.4)  # fmt: skip
    monitoring = BeaconTemplate("probe", dict(Template.from_stack(stack).to_json()))
    slow = by_name(run_alarm_definitions(monitoring, "exp-1", "run-1")[0], contract.RunAlarm.SLOW)
    assert slow["Threshold"] == 0.4 and "wait for it 40% of each step" in slow["AlarmDescription"]
    (dashboard,) = monitoring.of_type("AWS::CloudWatch::Dashboard").values()
    body = "".join(part for part in dashboard["Properties"]["DashboardBody"]["Fn::Join"][1] if isinstance(part, str))
    assert '"value":0.4,"label":"slow"' in body


def test_the_monitoring_stack_builds_its_alarms_at_the_team_files_slow_rank_share(demo_config: TeamConfig) -> None:
    from aws_cdk import aws_iam as iam
    from aws_cdk import aws_s3 as s3

    from stacks.monitoring import MonitoringStack

    config = demo_config.model_copy(
        update={"monitoring": demo_config.monitoring.model_copy(update={"slow_rank_share": 0.4})}
    )
    app = App()
    given = Stack(app, "Given")
    role = iam.Role.from_role_arn(given, "Role", "arn:aws:iam::123456789012:role/beacon-demo-writer")
    stack = MonitoringStack(app, "Monitoring", config=config, cluster_name="beacon-demo", writer_role=role,
                            bucket=s3.Bucket.from_bucket_name(given, "Bucket", "beacon-demo-artifacts"),
                            verdict_role=role, verdict_reader_role=role)  # fmt: skip
    monitoring = BeaconTemplate("monitoring", dict(Template.from_stack(stack).to_json()))
    assert by_name(run_alarm_definitions(monitoring, "exp-1", "run-1")[0], contract.RunAlarm.SLOW)["Threshold"] == 0.4


def test_slowed_alarm_watches_the_runs_step_time_over_its_baseline_for_the_sustained_span(run_alarms: Any) -> None:
    slowed = by_name(run_alarms[0], contract.RunAlarm.SLOWED)
    assert slowed["MetricName"] == contract.STEP_TIME_RATIO.name
    assert (slowed["Statistic"], slowed["Period"], slowed["Threshold"]) == ("Minimum", 30, RUN_SLOWED_RATIO)
    assert slowed["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    periods = slowed["EvaluationPeriods"]
    assert periods == slowed["DatapointsToAlarm"] and periods * slowed["Period"] == RUN_SLOWED_SUSTAINED_S
    assert slowed["TreatMissingData"] == "ignore", "no ratio (a rank stands out, the run hangs): the state stays"


def test_run_alarms_notify_once_through_the_composite_and_the_slow_ones_each_for_itself(
    run_alarms: Any, demo: Synthesized
) -> None:
    metric_alarms, composite = run_alarms
    slow, slowed = by_name(metric_alarms, contract.RunAlarm.SLOW), by_name(metric_alarms, contract.RunAlarm.SLOWED)
    members = [a for a in metric_alarms if a is not slow and a is not slowed]
    assert all(a["ActionsEnabled"] is False for a in members)
    names = [a["AlarmName"] for a in members] + [
        contract.team_alarm_name("demo", contract.TeamAlarm.UPLOAD_FAILURES),
        contract.team_alarm_name("demo", contract.TeamAlarm.SPOOL_BACKLOG),
    ]
    assert composite["AlarmRule"] == " OR ".join(f'ALARM("{n}")' for n in names)
    topic_id, _ = demo.template("monitoring").one_of_type("AWS::SNS::Topic")
    assert composite["AlarmActions"] == [f"<{topic_id}>"] == composite["OKActions"]
    for alarm in (slow, slowed):
        assert alarm["ActionsEnabled"] is True and alarm["AlarmActions"] == [f"<{topic_id}>"] == alarm["OKActions"]


def test_every_alarm_has_an_actionable_runbook(run_alarms: Any, demo: Synthesized) -> None:
    metric_alarms, composite = run_alarms
    for alarm in [*metric_alarms, composite]:
        assert_runbook(alarm["AlarmDescription"], doctor="beacon doctor --team demo --experiment exp-1 --run run-1")
    for alarm in team_alarm_definitions(demo.template("monitoring")):
        assert_runbook(alarm["AlarmDescription"], doctor="beacon doctor --team demo")


def test_run_alarm_template_is_an_advanced_ssm_parameter_named_by_the_contract(template: Template) -> None:
    template.has_resource_properties(
        "AWS::SSM::Parameter",
        {"Name": contract.run_alarm_parameter_name("demo"), "Tier": "Advanced", "Type": "String"},
    )


def test_team_delivery_alarms_fire_on_failures_or_a_growing_backlog_and_stay_ok_without_data(
    template: Template,
) -> None:
    for name, metric, statistic, comparison, threshold in (
        ("upload-failures", contract.UPLOAD_FAILURES, "Sum", "GreaterThanOrEqualToThreshold", 1),
        (
            "spool-backlog",
            contract.SPOOL_BACKLOG,
            "Maximum",
            "GreaterThanThreshold",
            contract.BACKLOG_THRESHOLD_RECORDS,
        ),
    ):
        template.has_resource_properties(
            "AWS::CloudWatch::Alarm",
            {
                "AlarmName": f"beacon-demo-{name}",
                "Namespace": "Beacon/demo",
                "MetricName": metric.name,
                "Dimensions": [{"Name": "Team", "Value": "demo"}],
                "Statistic": statistic,
                "Period": 60,
                "EvaluationPeriods": 3,
                "DatapointsToAlarm": 2,
                "ComparisonOperator": comparison,
                "Threshold": threshold,
                "TreatMissingData": "notBreaching",
                "AlarmActions": Match.absent(),
            },
        )


# What Container Insights publishes, as (metric, dimension set); an alarm on anything else never fires.
# Sources: CloudWatch User Guide, "Amazon EKS and Kubernetes Container Insights with enhanced observability
# metrics" (Container-Insights-metrics-enhanced-EKS), and the CloudWatch agent's EMF declarations
# (aws/amazon-cloudwatch-agent, translator/translate/otel/exporter/awsemf/kubernetes.go,
# getPodMetricDeclarations / getNamespaceMetricDeclarations), enhanced observability on (the add-on default).
CONTAINER_INSIGHTS_PUBLISHED = {
    ("pod_status_failed", frozenset({"ClusterName"})),
    ("pod_status_failed", frozenset({"ClusterName", "Namespace", "PodName"})),
    ("pod_status_failed", frozenset({"ClusterName", "Namespace", "PodName", "FullPodName"})),
    ("pod_status_failed", frozenset({"ClusterName", "Namespace", "Service"})),
    ("pod_number_of_container_restarts", frozenset({"ClusterName"})),
    ("pod_number_of_container_restarts", frozenset({"ClusterName", "Namespace", "PodName"})),
    ("pod_number_of_container_restarts", frozenset({"ClusterName", "Namespace", "PodName", "FullPodName"})),
    ("pod_number_of_container_restarts", frozenset({"ClusterName", "Namespace", "Service"})),
    ("namespace_number_of_running_pods", frozenset({"ClusterName", "Namespace"})),
    ("namespace_number_of_running_pods", frozenset({"ClusterName"})),
    ("node_gpu_utilization", frozenset({"ClusterName"})),
}


def restarts_alarm(demo: Synthesized) -> dict[str, Any]:
    (alarm,) = [
        a for a in team_alarm_definitions(demo.template("monitoring")) if a["AlarmName"] == "beacon-demo-restarts"
    ]
    return alarm


def test_restarts_alarm_watches_a_metric_container_insights_publishes(demo: Synthesized) -> None:
    """The old alarm watched pod_number_of_container_restarts under {ClusterName, Namespace}: never
    published, and with restartPolicy Never never non-zero. It must name a published series."""
    alarm = MetricAlarm.from_definition(restarts_alarm(demo))
    assert alarm.namespace == "ContainerInsights"
    dimensions = alarm.query.schema if alarm.query else frozenset(alarm.dimensions)
    assert (alarm.metric_name, dimensions) in CONTAINER_INSIGHTS_PUBLISHED
    assert alarm.metric_name != "pod_number_of_container_restarts", "Jobs run restartPolicy Never"
    assert alarm.dimensions == {"ClusterName": "beacon-demo", "Namespace": "training"}


def test_restarts_alarm_counts_failed_training_pods_and_notifies(demo: Synthesized) -> None:
    definition = restarts_alarm(demo)
    (query,) = definition["Metrics"]
    assert "GROUP BY" not in query["Expression"], "an alarm needs a single series"
    assert (query["Period"], definition["EvaluationPeriods"], definition["Threshold"]) == (60, 1, 1)
    assert definition["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert definition["TreatMissingData"] == "notBreaching"
    topic_id, _ = demo.template("monitoring").one_of_type("AWS::SNS::Topic")
    assert definition["AlarmActions"] == [{"Ref": topic_id}] == definition["OKActions"]


def test_restarts_alarm_fires_on_a_failed_training_pod_only(demo: Synthesized) -> None:
    alarm = MetricAlarm.from_definition(restarts_alarm(demo))

    def failed_pod(namespace: str, pod: str) -> SeriesKey:
        dimensions = {"ClusterName": "beacon-demo", "Namespace": namespace, "PodName": pod}
        return series_key("ContainerInsights", "pod_status_failed", dimensions)

    assert alarm.state({}, at=600) == OK, "an idle team stays OK"
    healthy = {failed_pod("training", "beacon-smoke-1"): [(float(t), 0.0) for t in range(0, 600, 60)]}
    assert alarm.state(healthy, at=600) == OK
    elsewhere = {failed_pod("kube-system", "coredns-x"): [(540.0, 1.0)]}
    assert alarm.state(elsewhere, at=600) == OK
    failed = {**healthy, failed_pod("training", "beacon-smoke-2"): [(540.0, 1.0)]}
    assert alarm.state(failed, at=600) == ALARM


def test_topic_is_kms_encrypted_tls_only_and_cloudwatch_may_use_its_key(template: Template, demo: Synthesized) -> None:
    template.has_resource_properties(
        "AWS::SNS::Topic", {"KmsMasterKeyId": {"Fn::GetAtt": [Match.string_like_regexp("MonitoringTopicKey"), "Arn"]}}
    )
    template.has_resource_properties(
        "AWS::SNS::TopicPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [Match.object_like({"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})]
                )
            }
        },
    )
    template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})
    _, key = demo.template("monitoring").one_of_type("AWS::KMS::Key")
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    cloudwatch = [s for s in statements if s["Principal"] == {"Service": "cloudwatch.amazonaws.com"}]
    assert cloudwatch and sorted(cloudwatch[0]["Action"]) == ["kms:Decrypt", "kms:GenerateDataKey*"]
    # Whether CloudWatch may publish and use the key is evaluated in test_policies_as_aws_evaluates.py.
    assert set(cloudwatch[0]["Condition"]) == {"ArnLike", "StringEquals"}


def test_no_email_subscription_when_none_is_configured(template: Template) -> None:
    template.resource_count_is("AWS::SNS::Subscription", 0)


def test_email_subscription_when_configured() -> None:
    stack = Stack(App(), "Probe")
    TrainingMonitoring(
        stack,
        "Monitoring",
        team="ml-vision",
        cluster_name="beacon-ml-vision",
        alarm_emails=["ml@example.com"],
        alarm_topic_arns=[],
    )
    Template.from_stack(stack).has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "ml@example.com"}
    )


def test_job_may_manage_only_its_teams_run_alarms_and_read_the_template(demo: Synthesized) -> None:
    _, policy = demo.template("monitoring").one_of_type(
        "AWS::IAM::Policy", logical_id_prefix="MonitoringRunAlarmsPolicy"
    )
    statements = {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    alarms = statements["ManageOwnRunAlarms"]
    assert sorted(alarms["Action"]) == sorted(["cloudwatch:PutMetricAlarm", "cloudwatch:PutCompositeAlarm"])
    assert json.dumps(alarms["Resource"]).endswith(':alarm:beacon-demo-run-*"]]}')
    assert set(alarms["Condition"]) == {"ForAllValues:StringEquals"}  # actions: the team's topic only
    deletes = statements["DeleteOwnRunAlarms"]
    assert deletes["Action"] == "cloudwatch:DeleteAlarms" and deletes["Resource"] == alarms["Resource"]
    parameter = statements["ReadRunAlarmTemplate"]
    assert parameter["Action"] == "ssm:GetParameter"
    parameter_id, _ = demo.template("monitoring").one_of_type("AWS::SSM::Parameter")
    assert parameter["Resource"]["Fn::Join"][1][-2:] == [":parameter", {"Ref": parameter_id}]
    (role,) = policy["Properties"]["Roles"]
    assert "WriterRole" in json.dumps(role)  # the artifact store's writer, imported across stacks


def test_dashboard_has_every_widget_the_issue_lists(demo: Synthesized) -> None:
    _, dashboard = demo.template("monitoring").one_of_type("AWS::CloudWatch::Dashboard")
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for needle in (
        "Loss per run",
        "Steps per second",
        "Heartbeats per 30 s",
        "Progress age",
        "Upload latency",
        "Spool backlog",
        "Checkpoint duration",
        "Failed pods",
        '\\"alarm\\"',
        "beacon doctor --team demo",
        "none for 120 s = silent",
        "stall threshold (sooner at a fast run's pace)",
    ):
        assert needle in body, needle
    for metric in (*contract.JOB_METRICS, *contract.EVENT_METRICS, *contract.RANK_METRICS):
        if metric is not contract.STEP:
            assert f'MetricName=\\\\\\"{metric.name}\\\\\\"' in body, metric.name
    assert "Team,Experiment,Run,Phase}" in body, "phases are graphed per phase"
    # GPU utilisation came from Container Insights' dcgm-exporter, now off: one DCGM host engine per GPU node, the
    # node monitoring agent's (issue 25, item 8; test_cluster_template.py)
    assert "node_gpu_utilization" not in body and "GPU utilisation" not in body


def test_stack_outputs_name_the_topic_template_and_team_alarms(template: Template) -> None:
    assert sorted(template.to_json()["Outputs"]) == [
        "AlarmTopicArn",
        "DashboardName",
        "RestartsAlarmName",
        "RunAlarmTemplateParameter",
        "SpoolBacklogAlarmName",
        "UploadFailuresAlarmName",
    ]
