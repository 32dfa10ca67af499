"""The cluster stack: EKS, Karpenter, the training namespace and volume objects, and the smoke Job."""

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from beacon import contract
from constructs import Construct

from beacon_constructs.bastion import ClusterBastion
from beacon_constructs.cluster import EFS_CSI_ADDON, OBSERVABILITY_ADDON, TrainingCluster
from beacon_constructs.gpu_device_plugin import NvidiaDevicePlugin
from beacon_constructs.karpenter import Karpenter, PoolSettings
from beacon_constructs.karpenter_manifests import pool_node_labels, pool_node_taints
from beacon_constructs.smoke_job import SmokeJob
from beacon_constructs.training_namespace import TrainingNamespace
from config import TeamConfig, names
from stacks import outputs
from workloads import manifests


class ClusterStack(Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: TeamConfig,
        cluster_name: str,
        vpc: ec2.IVpc,
        node_subnets: ec2.SubnetSelection,
        writer_role: iam.IRole,
        bucket: s3.IBucket,
        file_system: efs.IFileSystem,
        access_point: efs.IAccessPoint,
        **kwargs: object,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)  # type: ignore[arg-type]
        self.training_cluster = TrainingCluster(
            self,
            "Cluster",
            cluster_name=cluster_name,
            kubernetes_version=config.cluster.kubernetes_version,
            vpc=vpc,
            subnets=node_subnets,
            public_access_cidrs=list(config.cluster.public_access_cidrs),
            system_node_instance_type=config.cluster.system_node_instance_type,
            system_node_count=config.cluster.system_node_count,
            log_retention_days=config.monitoring.log_retention_days,
            container_insights_log_groups=names.container_insights_log_groups(cluster_name),
        )
        cluster = self.training_cluster.cluster
        compute = config.compute
        self.karpenter = Karpenter(
            self,
            "Karpenter",
            cluster=cluster,
            cluster_name=cluster_name,
            team=config.team,
            pools=PoolSettings(
                gpu_instance_families=list(compute.gpu_instance_families),
                gpu_instance_types=list(compute.gpu_instance_types),
                capacity_types=list(compute.capacity_types),
                gpu_limit=compute.gpu_limit,
                gpu_cpu_limit=compute.gpu_cpu_limit,
                smoke_cpu_limit=compute.smoke_cpu_limit,
            ),
            controller_replicas=config.cluster.karpenter_replicas,
            node_ami_alias=compute.node_ami_alias,
            node_role_name=names.karpenter_node_role_name(config.team),
        )
        # AL2023 NVIDIA nodes need the device plugin to advertise nvidia.com/gpu. Deploy order:
        # Karpenter -> plugin -> node pools, so destroy removes the pools (and their nodes) first.
        self.gpu_device_plugin = NvidiaDevicePlugin(
            self,
            "GpuDevicePlugin",
            cluster=cluster,
            node_labels=pool_node_labels(self.karpenter.node_pools["gpu"]),
            node_taints=pool_node_taints(self.karpenter.node_pools["gpu"]),
        )
        self.gpu_device_plugin.chart.node.add_dependency(self.karpenter.chart)
        self.karpenter.node_pool_manifest.node.add_dependency(self.gpu_device_plugin.chart)
        self.training = TrainingNamespace(
            self,
            "Training",
            cluster=cluster,
            writer_role=writer_role,
            file_system=file_system,
            access_point=access_point,
            depends_on_storage_driver=self.training_cluster.addons[EFS_CSI_ADDON],
            operator_role_arns=list(config.cluster.operator_role_arns),
        )
        self.smoke_job = SmokeJob(
            self,
            "SmokeJob",
            cluster=cluster,
            spec=manifests.smoke_job_spec(config, image="", bucket=bucket.bucket_name, region=self.region),
            platform=config.training.image_platform,
            after=[
                self.training.service_account,
                self.training.volume,
                self.training.pod_identity,
                self.karpenter.node_pool_manifest,
            ],
        )
        # What takes AWS credentials by Pod Identity starts once the agent that serves them is there: a preflight
        # that cannot get credentials exits 3, which the Job's podFailurePolicy takes as final.
        agent = cluster.eks_pod_identity_agent
        if agent is not None:
            for dependent in (
                self.karpenter.chart,
                self.training_cluster.addons[EFS_CSI_ADDON],
                self.training_cluster.addons[OBSERVABILITY_ADDON],
                self.smoke_job.manifest,
            ):
                dependent.node.add_dependency(agent)
        if config.cluster.bastion:
            self.bastion = ClusterBastion(self, "Bastion", vpc=vpc, subnets=node_subnets)
            cluster.connections.allow_from(
                self.bastion.connections, ec2.Port.tcp(443), "beacon smoke through the bastion's port forward"
            )
            CfnOutput(self, outputs.BASTION_INSTANCE_ID, value=self.bastion.host.instance_id)
            CfnOutput(self, outputs.CLUSTER_ENDPOINT, value=cluster.cluster_endpoint)
        CfnOutput(self, outputs.CLUSTER_NAME, value=cluster.cluster_name)
        CfnOutput(self, outputs.TRAINING_NAMESPACE, value=contract.TRAINING_NAMESPACE)
        CfnOutput(self, outputs.SMOKE_JOB_NAME, value=self.smoke_job.spec.name)
        CfnOutput(self, outputs.SMOKE_IMAGE_URI, value=self.smoke_job.image.image_uri)
        CfnOutput(self, outputs.INTERRUPTION_QUEUE_NAME, value=self.karpenter.queue.queue_name)
