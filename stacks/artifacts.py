"""The stateful stack: the artifact store. Everything in it is RETAINed."""

from aws_cdk import CfnOutput, Duration, Stack
from constructs import Construct

from beacon_constructs.artifact_store import ArtifactStore
from config import TeamConfig
from training import contract


class ArtifactsStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, *, config: TeamConfig, **kwargs: object) -> None:
        super().__init__(scope, construct_id, **kwargs)  # type: ignore[arg-type]
        self.store = ArtifactStore(
            self,
            "ArtifactStore",
            noncurrent_version_retention=Duration.days(config.artifacts.noncurrent_version_retention_days),
            abort_incomplete_multipart_after=Duration.days(config.artifacts.abort_incomplete_multipart_days),
            metric_namespace=contract.NAMESPACE,
        )
        CfnOutput(self, "BucketName", value=self.store.bucket.bucket_name)
        CfnOutput(self, "WriterRoleArn", value=self.store.writer_role.role_arn)
        CfnOutput(self, "ReaderRoleArn", value=self.store.reader_role.role_arn)
        CfnOutput(self, "KmsKeyArn", value=self.store.key.key_arn)
