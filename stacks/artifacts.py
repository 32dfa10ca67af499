"""The stateful stack: the artifact store, the artifact volume and the image repository. Everything in it
is RETAINed."""

from aws_cdk import Aws, CfnOutput, DefaultStackSynthesizer, Duration, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from beacon import contract
from constructs import Construct

from beacon_constructs.artifact_store import ArtifactStore
from beacon_constructs.image_repository import ImageRepository
from beacon_constructs.volume import ArtifactVolume
from config import TeamConfig, names
from stacks import outputs
from workloads import manifests


class ArtifactsStack(Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: TeamConfig,
        vpc: ec2.IVpc,
        volume_subnets: ec2.SubnetSelection,
        node_security_group: ec2.ISecurityGroup,
        **kwargs: object,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)  # type: ignore[arg-type]
        readers = (*config.cluster.operator_role_arns, *config.artifacts.reader_role_arns)
        self.store = ArtifactStore(
            self,
            "ArtifactStore",
            noncurrent_version_retention=Duration.days(config.artifacts.noncurrent_version_retention_days),
            abort_incomplete_multipart_after=Duration.days(config.artifacts.abort_incomplete_multipart_days),
            metric_namespace=contract.metric_namespace(config.team),
            cluster_name=names.cluster_name(config.team),
            training_namespace=contract.TRAINING_NAMESPACE,
            training_service_account=manifests.TRAINING_SERVICE_ACCOUNT,
            cluster_log_group=names.container_log_group(names.cluster_name(config.team)),
            training_job_log_group=names.SAGEMAKER_LOG_GROUP,
            training_job_prefix=names.training_job_prefix(config.team),
            reader_role_arns=list(dict.fromkeys(readers)),
            reader_tag=names.reader_tag(config.team),
        )
        self.volume = ArtifactVolume(
            self,
            "ArtifactVolume",
            vpc=vpc,
            subnets=volume_subnets,
            client_security_group=node_security_group,
            uid=config.training.uid,
            gid=config.training.gid,
        )
        # The node role pulls (on EKS the kubelet does, with its node's role) through its own managed
        # policy; the cluster stack creates it after this one, under a fixed name. SageMaker pulls as the
        # writer, its execution role. Images are encrypted with the store's key: ECR uses it by grant.
        node_role_arn = self.format_arn(
            service="iam", region="", resource="role", resource_name=names.karpenter_node_role_name(config.team)
        )
        self.images = ImageRepository(
            self,
            "ImageRepository",
            encryption_key=self.store.key,
            untagged_image_expiry=Duration.days(config.images.untagged_expiry_days),
            pull_roles=[self.store.writer_role],
            node_role_arns=[node_role_arn],
            push_role_arns=list(config.images.push_role_arns),
        )
        # Beacon's own smoke image, published by `cdk deploy` (the cluster stack's image asset) into a repository of
        # the team's: the node role (EKS) and the writer (SageMaker's execution role) pull it, as they pull the
        # team's images; the CDK bootstrap's image-publishing role pushes it; another team's roles may do neither.
        publishing_role_arn = self.format_arn(
            service="iam",
            region="",
            resource="role",
            resource_name=names.cdk_image_publishing_role_name(
                # the qualifier `cdk bootstrap` was given, as the synthesizer reads it
                self.node.try_get_context("@aws-cdk/core:bootstrapQualifier")
                or DefaultStackSynthesizer.DEFAULT_QUALIFIER,
                Aws.ACCOUNT_ID,
                Aws.REGION,
            ),
        )
        self.smoke_images = ImageRepository(
            self,
            "SmokeImageRepository",
            repository_name=names.smoke_image_repository(config.team),
            encryption_key=self.store.key,
            untagged_image_expiry=Duration.days(config.images.untagged_expiry_days),
            pull_roles=[self.store.writer_role],
            node_role_arns=[node_role_arn],
            push_role_arns=[publishing_role_arn],
            # Rebuilt and pushed by every deploy: it goes with the stack (retained under its fixed name, it would
            # fail the next deploy after a destroy with AlreadyExists)
            removal_policy=RemovalPolicy.DESTROY,
        )
        CfnOutput(self, outputs.BUCKET_NAME, value=self.store.bucket.bucket_name)
        CfnOutput(self, outputs.WRITER_ROLE_ARN, value=self.store.writer_role.role_arn)
        CfnOutput(self, outputs.READER_ROLE_ARN, value=self.store.reader_role.role_arn)
        CfnOutput(self, outputs.KMS_KEY_ARN, value=self.store.key.key_arn)
        CfnOutput(self, outputs.FILE_SYSTEM_ID, value=self.volume.file_system.file_system_id)
        CfnOutput(self, outputs.ACCESS_POINT_ID, value=self.volume.access_point.access_point_id)
        CfnOutput(self, outputs.IMAGE_REPOSITORY_URI, value=self.images.repository.repository_uri)
