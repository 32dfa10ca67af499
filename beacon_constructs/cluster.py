"""The EKS cluster (aws_eks_v2): private endpoint by default, all control-plane logs, envelope-
encrypted secrets, a small system node group for Karpenter and add-ons, access entries only."""

from __future__ import annotations

from typing import Any, cast

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk.lambda_layer_kubectl_v35 import KubectlV35Layer
from constructs import Construct

from beacon_constructs.gpu_device_plugin import toleration_for
from beacon_constructs.log_groups import AdoptedLogGroups, log_group
from beacon_constructs.nag import acknowledge
from beacon_constructs.pod_identity import pod_identity_principal
from beacon_constructs.tagging import tag_component
from workloads.manifests import EFS_CSI_NAMESPACE, GPU_TAINT

KUBERNETES_VERSIONS = {"1.35": eks.KubernetesVersion.V1_35}
KUBECTL_LAYERS = {"1.35": KubectlV35Layer}
CONTROL_PLANE_LOGS = (
    eks.ClusterLoggingTypes.API,
    eks.ClusterLoggingTypes.AUDIT,
    eks.ClusterLoggingTypes.AUTHENTICATOR,
    eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
    eks.ClusterLoggingTypes.SCHEDULER,
)
# Managed add-ons, installed explicitly (bootstrap_self_managed_addons is off).
CORE_ADDONS = ("vpc-cni", "coredns", "kube-proxy")
# Without these a node never becomes Ready: the system node group waits for them.
NODE_NETWORKING_ADDONS = ("vpc-cni", "kube-proxy")
EFS_CSI_ADDON, EFS_CSI_SERVICE_ACCOUNT = "aws-efs-csi-driver", "efs-csi-controller-sa"
OBSERVABILITY_ADDON = "amazon-cloudwatch-observability"
OBSERVABILITY_NAMESPACE, OBSERVABILITY_SERVICE_ACCOUNT = "amazon-cloudwatch", "cloudwatch-agent"
# Sets the node conditions Karpenter's node repair acts on (AcceleratedHardwareReady for a GPU's Xid, KernelReady,
# NetworkingReady, StorageReady, ContainerRuntimeReady). No AWS permission: it writes its own node's conditions
# through RBAC the add-on brings. Its agent DaemonSet tolerates every taint; its dcgm-server DaemonSet (the DCGM host
# engine the agent reads a GPU through) tolerates none by default, and without it on a GPU node the agent reports
# DCGMError, a Fatal AcceleratedHardwareReady=False: node repair would replace every GPU node 10 minutes after it
# boots. So the host engine tolerates the GPU pool's taint (the add-on's dcgmAgent.tolerations).
NODE_MONITORING_ADDON = "eks-node-monitoring-agent"
NODE_MONITORING_CONFIGURATION = {"dcgmAgent": {"tolerations": [toleration_for(GPU_TAINT)]}}
# One DCGM host engine per GPU node: the observability add-on's dcgm-exporter embeds a host engine of its own by
# default, and two engines on one node can mark the GPU unhealthy (aws/containers-roadmap 2763,
# aws/eks-node-monitoring-agent 255 and 256): AcceleratedHardwareReady=False, and node repair replaces the node ten
# minutes later, mid-run. The agent's engine stays (node repair reads the GPU's health through it); the exporter goes,
# and with it Container Insights' GPU utilisation metrics. Its chart cannot point it at another engine.
OBSERVABILITY_CONFIGURATION = {"dcgmExporter": {"enabled": False}}


class TrainingCluster(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        kubernetes_version: str,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        public_access_cidrs: list[str],
        system_node_instance_type: str,
        system_node_count: int,
        log_retention_days: int,
        container_insights_log_groups: list[str],
    ) -> None:
        super().__init__(scope, construct_id)
        tag_component(self, "cluster")
        self.secrets_key = kms.Key(
            self, "SecretsKey", description=f"{cluster_name}: Kubernetes secrets envelope", enable_key_rotation=True
        )
        # EKS writes to this group once logging is on; created here so its retention is ours.
        self.control_plane_logs = log_group(
            self, "ControlPlaneLogs", retention_days=log_retention_days, name=f"/aws/eks/{cluster_name}/cluster"
        )
        endpoint = (
            eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*public_access_cidrs)
            if public_access_cidrs
            else eks.EndpointAccess.PRIVATE
        )
        self.cluster = eks.Cluster(
            self,
            "Cluster",
            cluster_name=cluster_name,
            version=KUBERNETES_VERSIONS[kubernetes_version],
            vpc=vpc,
            vpc_subnets=[subnets],
            endpoint_access=endpoint,
            cluster_logging=list(CONTROL_PLANE_LOGS),
            secrets_encryption_key=self.secrets_key,
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=system_node_count,
            default_capacity_instance=ec2.InstanceType(system_node_instance_type),
            bootstrap_self_managed_addons=False,
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=KUBECTL_LAYERS[kubernetes_version](self, "KubectlLayer"),
            ),
        )
        self.cluster.node.add_dependency(self.control_plane_logs)
        self._icluster = cast(eks.ICluster, self.cluster)  # jsii's protocol lags the class
        self.addons = {
            name: eks.Addon(self, f"Addon-{name}", cluster=self._icluster, addon_name=name) for name in CORE_ADDONS
        }
        self.system_nodegroup = self.cluster.default_nodegroup
        if self.system_nodegroup is not None:
            self.system_nodegroup.node.add_dependency(*(self.addons[name] for name in NODE_NETWORKING_ADDONS))
        self.cluster_name = cluster_name
        self.efs_csi_role = self._pod_identity_role(
            "EfsCsiRole", "service-role/AmazonEFSCSIDriverPolicy", EFS_CSI_NAMESPACE, EFS_CSI_SERVICE_ACCOUNT
        )
        self.addons[EFS_CSI_ADDON] = self._addon_with_identity(
            "Addon-efs-csi", EFS_CSI_ADDON, self.efs_csi_role, EFS_CSI_SERVICE_ACCOUNT
        )
        self.observability_role = self._pod_identity_role(
            "ObservabilityRole", "CloudWatchAgentServerPolicy", OBSERVABILITY_NAMESPACE, OBSERVABILITY_SERVICE_ACCOUNT
        )
        # The add-on's Container Insights groups, held to the team's retention from before it first writes
        self.container_insights_logs = AdoptedLogGroups(
            self,
            "ContainerInsightsLogs",
            names=container_insights_log_groups,
            retention_days=log_retention_days,
            component="cluster",
        )
        self.addons[OBSERVABILITY_ADDON] = self._addon_with_identity(
            "Addon-observability", OBSERVABILITY_ADDON, self.observability_role, OBSERVABILITY_SERVICE_ACCOUNT,
            configuration=OBSERVABILITY_CONFIGURATION,
        )  # fmt: skip
        self.addons[OBSERVABILITY_ADDON].node.add_dependency(*self.container_insights_logs.held)
        self.addons[NODE_MONITORING_ADDON] = eks.Addon(
            self,
            "Addon-node-monitoring",
            cluster=self._icluster,
            addon_name=NODE_MONITORING_ADDON,
            configuration_values=NODE_MONITORING_CONFIGURATION,
        )
        self._acknowledge()

    def _addon_with_identity(
        self,
        addon_id: str,
        name: str,
        role: iam.IRole,
        service_account: str,
        *,
        configuration: dict[str, Any] | None = None,
    ) -> eks.Addon:
        """The add-on creates its own Pod Identity association, so its pods never start without it."""
        addon = eks.Addon(self, addon_id, cluster=self._icluster, addon_name=name, configuration_values=configuration)
        cfn_addon = cast(eks.CfnAddon, addon.node.default_child)
        cfn_addon.pod_identity_associations = [
            eks.CfnAddon.PodIdentityAssociationProperty(role_arn=role.role_arn, service_account=service_account)
        ]
        return addon

    def _pod_identity_role(self, role_id: str, managed_policy: str, namespace: str, service_account: str) -> iam.Role:
        role = iam.Role(
            self,
            role_id,
            assumed_by=pod_identity_principal(
                self, cluster_name=self.cluster_name, namespace=namespace, service_account=service_account
            ),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(managed_policy)],
        )
        acknowledge(
            role,
            f"IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{managed_policy}]",
            f"The AWS-maintained policy for the {service_account} add-on tracks the add-on's own needs.",
        )
        return role

    def _acknowledge(self) -> None:
        kubectl = {
            "IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]": (
                "CDK's kubectl handler and its provider framework write their own logs."
            ),
            "IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole]": (
                "The kubectl handler runs inside the VPC to reach the private endpoint."
            ),
            'IAM4[Policy::{"Fn::If":["ClusterKubectlProviderHandlerHasEcrPublic6FE395CA",{"Fn::Join":["",["arn:",'
            '{"Ref":"AWS::Partition"},":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly"]]},'
            '{"Ref":"AWS::NoValue"}]}]': "The kubectl handler pulls the Karpenter chart from ECR Public (OCI).",
            "L1": "CDK's kubectl handler pins its own runtime to match the kubectl layer.",
            "IAM5[Resource::<ClusterKubectlProviderHandler93C0312D.Arn>:*]": (
                "The provider framework invokes every version of CDK's own kubectl handler."
            ),
        }
        for finding, reason in kubectl.items():
            acknowledge(self.cluster, finding, reason)
        acknowledge(
            self.cluster,
            "IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonEKSClusterPolicy]",
            "The EKS service role needs the AWS-maintained cluster policy.",
        )
        for name in ("AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryReadOnly"):
            acknowledge(
                self.cluster,
                f"IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]",
                "The system node group's role needs the AWS-maintained EKS worker policies.",
            )
