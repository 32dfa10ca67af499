"""The monitoring stack: alarms, dashboard and topic; grants the job its run-alarm rights; the function that
publishes the doctor's verdict when a run's metrics-lost alarm fires."""

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from beacon_constructs.alarm_verdict import AlarmVerdict
from beacon_constructs.monitoring import TrainingMonitoring
from config import TeamConfig
from stacks import outputs


class MonitoringStack(Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: TeamConfig,
        cluster_name: str,
        writer_role: iam.IRole,
        bucket: s3.IBucket,
        verdict_role: iam.IRole,
        verdict_reader_role: iam.IRole,
        **kwargs: object,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)  # type: ignore[arg-type]
        self.monitoring = TrainingMonitoring(
            self,
            "Monitoring",
            team=config.team,
            cluster_name=cluster_name,
            alarm_emails=list(config.monitoring.alarm_email),
            alarm_topic_arns=list(config.monitoring.alarm_topic_arns),
            slow_rank_share=config.monitoring.slow_rank_share,
        )
        self.monitoring.grant_run_alarms(writer_role)
        self.alarm_verdict = AlarmVerdict(
            self,
            "AlarmVerdict",
            team=config.team,
            topic=self.monitoring.topic,
            topic_key=self.monitoring.topic_key,
            bucket=bucket,
            role=verdict_role,
            reader_role=verdict_reader_role,
            alarm_arns=self.monitoring.own_alarm_arns,
            log_retention_days=config.monitoring.log_retention_days,
            prices=config.prices.table(),
        )
        CfnOutput(self, outputs.ALARM_TOPIC_ARN, value=self.monitoring.topic.topic_arn)
        CfnOutput(self, outputs.RUN_ALARM_TEMPLATE_PARAMETER, value=self.monitoring.run_alarm_parameter.parameter_name)
        CfnOutput(self, outputs.DASHBOARD_NAME, value=self.monitoring.dashboard.dashboard_name)
        for alarm in self.monitoring.team_alarms:
            CfnOutput(self, outputs.team_alarm_output(alarm.node.id), value=alarm.alarm_name)
