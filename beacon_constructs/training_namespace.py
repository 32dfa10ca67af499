"""Where training runs: the namespace, its service account bound to the writer role by Pod Identity,
and the artifact volume as a static PersistentVolume on the access point, mounted with IAM over TLS."""

from __future__ import annotations

from typing import cast

from aws_cdk import aws_efs as efs
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from beacon import contract
from constructs import Construct

from beacon_constructs.pod_identity import pod_identity_principal
from beacon_constructs.tagging import tag_component
from workloads import manifests

OPERATOR_ACCESS_POLICY = "AmazonEKSEditPolicy"
EFS_CSI_NAMESPACE = manifests.EFS_CSI_NAMESPACE


class TrainingNamespace(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        writer_role: iam.IRole,
        file_system: efs.IFileSystem,
        access_point: efs.IAccessPoint,
        depends_on_storage_driver: eks.Addon,
        operator_role_arns: list[str],
    ) -> None:
        super().__init__(scope, construct_id)
        tag_component(self, "training-namespace")
        self.namespace = cluster.add_manifest("Namespace", manifests.namespace())
        # Before any pod of the namespace: a pod selecting no Beacon pool would land on a system node (IMDS hop limit 2)
        self.pool_policy = cluster.add_manifest("PodsOnBeaconPools", *manifests.pool_admission_policy())
        self.pool_policy.node.add_dependency(self.namespace)
        self.service_account = cluster.add_manifest("ServiceAccount", manifests.service_account())
        self.service_account.node.add_dependency(self.namespace)
        self.pod_identity = eks.CfnPodIdentityAssociation(
            self,
            "WriterAssociation",
            cluster_name=cluster.cluster_name,
            namespace=contract.TRAINING_NAMESPACE,
            service_account=manifests.TRAINING_SERVICE_ACCOUNT,
            role_arn=writer_role.role_arn,
        )
        self.mount_role = self._volume_mount_role(cluster, file_system, access_point)
        # The driver's node pods read their credentials at start: the association comes first.
        depends_on_storage_driver.node.add_dependency(self.mount_association)
        self.volume = cluster.add_manifest(
            "ArtifactVolume",
            manifests.storage_class(),
            manifests.persistent_volume(file_system.file_system_id, access_point.access_point_id),
            manifests.persistent_volume_claim(),
        )
        self.volume.node.add_dependency(self.namespace, depends_on_storage_driver)
        # Who runs `beacon smoke`: edit rights in the training namespace only (Jobs, pods, logs).
        self.operator_access = [
            eks.AccessEntry(
                self,
                f"OperatorAccess{index}",
                cluster=cast(eks.ICluster, cluster),  # jsii's protocol lags the class
                principal=arn,
                access_policies=[
                    eks.AccessPolicy.from_access_policy_name(
                        OPERATOR_ACCESS_POLICY,
                        access_scope_type=eks.AccessScopeType.NAMESPACE,
                        namespaces=[contract.TRAINING_NAMESPACE],
                    )
                ],
            )
            for index, arn in enumerate(operator_role_arns)
        ]
        # The doctor's reads outside the namespace (nodes, their events), by RBAC bound to this group.
        for entry in self.operator_access:
            cast(eks.CfnAccessEntry, entry.node.default_child).add_property_override(
                "KubernetesGroups", [manifests.DOCTOR_READERS_GROUP]
            )
        self.doctor_read_access = cluster.add_manifest("DoctorReadAccess", *manifests.doctor_read_access())

    def _volume_mount_role(
        self, cluster: eks.Cluster, file_system: efs.IFileSystem, access_point: efs.IAccessPoint
    ) -> iam.Role:
        """The identity the EFS CSI driver mounts with (``mountOptions: [iam]``): its node pods' service
        account, by Pod Identity. The managed add-on offers an association for its controller only."""
        role = iam.Role(
            self,
            "VolumeMountRole",
            description="EFS CSI driver node pods: mount the training access point over TLS",
            assumed_by=pod_identity_principal(
                self,
                cluster_name=cluster.cluster_name,
                namespace=EFS_CSI_NAMESPACE,
                service_account=manifests.EFS_CSI_NODE_SERVICE_ACCOUNT,
            ),
        )
        iam.Policy(
            self,
            "VolumeMountPolicy",
            roles=[role],
            statements=[
                iam.PolicyStatement(
                    sid="MountTrainingAccessPoint",
                    actions=["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"],
                    resources=[file_system.file_system_arn],
                    conditions={"StringEquals": {"elasticfilesystem:AccessPointArn": access_point.access_point_arn}},
                )
            ],
        )
        self.mount_association = eks.CfnPodIdentityAssociation(
            self,
            "VolumeMountAssociation",
            cluster_name=cluster.cluster_name,
            namespace=EFS_CSI_NAMESPACE,
            service_account=manifests.EFS_CSI_NODE_SERVICE_ACCOUNT,
            role_arn=role.role_arn,
        )
        return role
