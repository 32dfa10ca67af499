"""The stack output keys: the stacks write them, the operator reads them, and nobody else spells them.

Plain constants, importable without aws_cdk: the operator imports this module and nothing else of stacks/.
"""

from __future__ import annotations

# beacon-<team>-network
VPC_ID = "VpcId"
# beacon-<team>-artifacts
BUCKET_NAME = "BucketName"
WRITER_ROLE_ARN = "WriterRoleArn"
READER_ROLE_ARN = "ReaderRoleArn"
KMS_KEY_ARN = "KmsKeyArn"
FILE_SYSTEM_ID = "FileSystemId"
ACCESS_POINT_ID = "AccessPointId"
IMAGE_REPOSITORY_URI = "ImageRepositoryUri"
# beacon-<team>-cluster
BASTION_INSTANCE_ID = "BastionInstanceId"
CLUSTER_ENDPOINT = "ClusterEndpoint"
CLUSTER_NAME = "ClusterName"
TRAINING_NAMESPACE = "TrainingNamespace"
SMOKE_JOB_NAME = "SmokeJobName"
SMOKE_IMAGE_URI = "SmokeImageUri"
INTERRUPTION_QUEUE_NAME = "InterruptionQueueName"
# beacon-<team>-monitoring
ALARM_TOPIC_ARN = "AlarmTopicArn"
RUN_ALARM_TEMPLATE_PARAMETER = "RunAlarmTemplateParameter"
DASHBOARD_NAME = "DashboardName"
# Each team alarm's name is an output named after the alarm's construct id with this suffix.
TEAM_ALARM_SUFFIX = "Name"
TEAM_ALARM_OUTPUT_SUFFIX = f"Alarm{TEAM_ALARM_SUFFIX}"


def team_alarm_output(construct_id: str) -> str:
    return f"{construct_id}{TEAM_ALARM_SUFFIX}"


# What the operator needs of each stack (`beacon smoke`, `beacon run`); a missing one is named.
OPERATOR_NEEDS = {
    "artifacts": (BUCKET_NAME, WRITER_ROLE_ARN, READER_ROLE_ARN, KMS_KEY_ARN, IMAGE_REPOSITORY_URI),
    "cluster": (CLUSTER_NAME, TRAINING_NAMESPACE, SMOKE_IMAGE_URI),
    "monitoring": (ALARM_TOPIC_ARN, RUN_ALARM_TEMPLATE_PARAMETER),
}
