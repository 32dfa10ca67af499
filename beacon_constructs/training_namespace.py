"""Where training runs: the namespace, its service account bound to the writer role by Pod Identity,
and the artifact volume as a static PersistentVolume on the access point."""

from __future__ import annotations

from typing import cast

from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from beacon_constructs.tagging import tag_component
from training import contract, manifests

OPERATOR_ACCESS_POLICY = "AmazonEKSEditPolicy"


class TrainingNamespace(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        writer_role: iam.IRole,
        file_system_id: str,
        access_point_id: str,
        depends_on_storage_driver: eks.Addon,
        operator_role_arns: list[str],
    ) -> None:
        super().__init__(scope, construct_id)
        tag_component(self, "training-namespace")
        self.namespace = cluster.add_manifest("Namespace", manifests.namespace())
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
        self.volume = cluster.add_manifest(
            "ArtifactVolume",
            manifests.storage_class(),
            manifests.persistent_volume(file_system_id, access_point_id),
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
