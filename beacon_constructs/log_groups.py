"""Log groups with the team's retention in days (RetentionDays is an enum of names, not numbers), and those a service
creates on its own, held to the same retention."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import ArnFormat, RemovalPolicy, Stack
from aws_cdk import aws_logs as logs
from aws_cdk import custom_resources as cr
from constructs import Construct

from beacon_constructs.nag import acknowledge, nag_arn
from beacon_constructs.tagging import tag_component


def log_group(scope: Construct, construct_id: str, *, retention_days: int, name: str | None = None) -> logs.LogGroup:
    group = logs.LogGroup(scope, construct_id, log_group_name=name, removal_policy=RemovalPolicy.DESTROY)
    cfn = group.node.default_child
    assert isinstance(cfn, logs.CfnLogGroup)
    cfn.retention_in_days = retention_days
    return group


class AdoptedLogGroups(Construct):
    """Log groups a service creates itself (the observability add-on's Container Insights groups, with no retention:
    training output kept forever), created here if missing or adopted as they are, and held to the team's retention.

    Not AWS::Logs::LogGroup resources: on a stack deployed before, the add-on has created them, and a log group of the
    same name would fail the update with AlreadyExists. So each group is two SDK calls, on create and update alike:
    CreateLogGroup (its AlreadyExists ignored), then PutRetentionPolicy. Nothing deletes them: `make destroy` says they
    remain, and how to remove them."""

    def __init__(
        self, scope: Construct, construct_id: str, *, names: Sequence[str], retention_days: int, component: str
    ) -> None:
        super().__init__(scope, construct_id)
        self.names = list(names)
        stack = Stack.of(self)
        arns = [
            stack.format_arn(service="logs", resource="log-group", resource_name=f"{name}{suffix}",
                             arn_format=ArnFormat.COLON_RESOURCE_NAME)
            for name in self.names
            for suffix in ("", ":*")
        ]  # fmt: skip
        policy = cr.AwsCustomResourcePolicy.from_sdk_calls(resources=arns)
        # The SDK-call function's own log, at the same retention (CDK's default keeps it two years, retained)
        self.function_logs = log_group(self, "FunctionLogs", retention_days=retention_days)
        self.held: list[cr.AwsCustomResource] = []
        for index, name in enumerate(self.names):
            create = cr.AwsSdkCall(
                service="CloudWatchLogs",
                action="createLogGroup",
                parameters={"logGroupName": name},
                physical_resource_id=cr.PhysicalResourceId.of(f"{name}:exists"),
                ignore_error_codes_matching="ResourceAlreadyExistsException",
            )
            retain = cr.AwsSdkCall(
                service="CloudWatchLogs",
                action="putRetentionPolicy",
                parameters={"logGroupName": name, "retentionInDays": retention_days},
                physical_resource_id=cr.PhysicalResourceId.of(f"{name}:retention"),
            )
            exists, retention = (
                cr.AwsCustomResource(
                    self,
                    f"{kind}{index}",
                    on_create=call,
                    on_update=call,
                    policy=policy,
                    install_latest_aws_sdk=False,
                    log_group=self.function_logs,
                )
                for kind, call in (("Exists", create), ("Retention", retain))
            )
            retention.node.add_dependency(exists)
            self.held += [exists, retention]
        for name in self.names:
            acknowledge(
                self,
                f"IAM5[Resource::{nag_arn(stack, 'logs', 'log-group', f'{name}:*')}]",
                "The group's ARN as IAM matches it for CreateLogGroup and PutRetentionPolicy, ':*' as AWS appends it.",
            )
        # CDK's one SDK-call function of the stack, which every AwsCustomResource shares
        function = stack.node.try_find_child("AWS" + cr.AwsCustomResource.PROVIDER_FUNCTION_UUID.replace("-", ""))
        if function is not None:
            tag_component(function, component)  # it lives at the stack's root, outside the construct that made it
            acknowledge(
                function,
                "IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]",
                "CDK's SDK-call function writes its own logs.",
            )
            acknowledge(function, "L1", "CDK's SDK-call function pins its own runtime.")
