"""The job arms and disarms its own run alarms in moto, as the writer, with IAM enforced.

moto stores alarms (it never evaluates them: see test_alarm_evaluator for that). What this proves
is that the synthesized template instantiates into valid PutMetricAlarm/PutCompositeAlarm calls,
that the writer's grant allows it, and that a clean exit leaves no run alarm behind. moto checks
CloudWatch and SSM calls against the resource "*" only, so the grant's name-prefix scoping is
asserted on the template (test_monitoring_template), not here.
"""

from __future__ import annotations

from typing import Any

from beacon import contract
from beacon.sinks.run_alarms import RunAlarms

from tests.conftest import WriterSession

PREFIX = contract.run_alarm_prefix("demo")


def run_alarms_seen_by_admin(as_writer: WriterSession) -> dict[str, Any]:
    as_writer.aws.reset_auth_only()
    try:
        return dict(as_writer.aws.client("cloudwatch").describe_alarms(AlarmNamePrefix=PREFIX))
    finally:
        as_writer.aws.enforce_iam()


def test_team_alarms_exist_after_provisioning_and_no_run_alarm_does(as_writer: WriterSession) -> None:
    assert sorted(as_writer.provisioned.monitoring.team_alarm_names) == sorted(
        contract.team_alarm_name("demo", k) for k in contract.TeamAlarm
    )
    seen = run_alarms_seen_by_admin(as_writer)
    assert seen["MetricAlarms"] == [] and seen["CompositeAlarms"] == []


def test_the_writer_arms_its_run_alarms_from_the_template_and_disarms_them_on_exit(as_writer: WriterSession) -> None:
    alarms = RunAlarms(as_writer.client("cloudwatch"), as_writer.client("ssm"), "demo", "exp-1", "run-1")
    alarms.arm()
    seen = run_alarms_seen_by_admin(as_writer)
    metric_names = sorted(a["AlarmName"] for a in seen["MetricAlarms"])
    assert metric_names == sorted(n for n in alarms.names() if not n.endswith("metrics-lost"))
    silent = next(a for a in seen["MetricAlarms"] if a["AlarmName"].endswith("-silent"))
    assert {d["Name"]: d["Value"] for d in silent["Dimensions"]} == {
        "Team": "demo",
        "Experiment": "exp-1",
        "Run": "run-1",
    }
    (composite,) = seen["CompositeAlarms"]
    assert composite["AlarmName"] == contract.run_alarm_name("demo", "exp-1", "run-1", contract.RunAlarm.METRICS_LOST)
    assert composite["AlarmActions"] == [as_writer.provisioned.monitoring.topic_arn]

    alarms.disarm()
    seen = run_alarms_seen_by_admin(as_writer)
    assert seen["MetricAlarms"] == [] and seen["CompositeAlarms"] == []


def test_a_run_given_its_own_slow_rank_share_arms_its_slow_alarm_at_it(as_writer: WriterSession) -> None:
    """`beacon.init(slow_rank_share=0.4)` (or its BEACON_ variable) beside a team file at 25 %: the run's alarm, its
    rank 0 and its doctor (the preflight record) hold a rank to the run's one number."""
    alarms = RunAlarms(as_writer.client("cloudwatch"), as_writer.client("ssm"), "demo", "exp-1", "run-2", 0.4)
    alarms.arm()
    slow_name = contract.run_alarm_name("demo", "exp-1", "run-2", contract.RunAlarm.SLOW)
    (slow,) = [a for a in run_alarms_seen_by_admin(as_writer)["MetricAlarms"] if a["AlarmName"] == slow_name]
    assert slow["Threshold"] == 0.4 and "wait for it 40% of each step" in slow["AlarmDescription"], slow
    alarms.disarm()
