"""Log groups with the team's retention in days (RetentionDays is an enum of names, not numbers)."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_logs as logs
from constructs import Construct


def log_group(scope: Construct, construct_id: str, *, retention_days: int, name: str | None = None) -> logs.LogGroup:
    group = logs.LogGroup(scope, construct_id, log_group_name=name, removal_policy=RemovalPolicy.DESTROY)
    cfn = group.node.default_child
    assert isinstance(cfn, logs.CfnLogGroup)
    cfn.retention_in_days = retention_days
    return group
