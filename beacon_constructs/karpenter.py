"""Karpenter: controller (Helm, Pod Identity), node role, interruption queue, node classes and pools.

The controller policy carries the upstream getting-started policy's action groups with the same
tag and region scoping: node lifecycle, IAM integration, EKS integration, interruption, zonal shift,
and resource discovery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from aws_cdk import Aws, Duration
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from beacon_constructs import karpenter_manifests as km
from beacon_constructs.nag import acknowledge
from beacon_constructs.pod_identity import scope_pod_identity_trust
from beacon_constructs.tagging import tag_component

CHART = "karpenter"
CHART_REPOSITORY = "oci://public.ecr.aws/karpenter/karpenter"
# Helm never upgrades a chart's crds/ folder: the CRDs come from their own chart, same version.
CRD_CHART = "karpenter-crd"
CRD_CHART_REPOSITORY = "oci://public.ecr.aws/karpenter/karpenter-crd"
CHART_VERSION = "1.14.1"
NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "karpenter"
NODE_MANAGED_POLICIES = (
    "AmazonEKS_CNI_Policy",
    "AmazonEKSWorkerNodePolicy",
    "AmazonEC2ContainerRegistryPullOnly",
    "AmazonSSMManagedInstanceCore",
)
# The five rules of the upstream template: (id, source, detail-type).
INTERRUPTION_RULES = (
    ("ScheduledChange", "aws.health", "AWS Health Event"),
    ("SpotInterruption", "aws.ec2", "EC2 Spot Instance Interruption Warning"),
    ("Rebalance", "aws.ec2", "EC2 Instance Rebalance Recommendation"),
    ("InstanceStateChange", "aws.ec2", "EC2 Instance State-change Notification"),
    ("CapacityReservationInterruption", "aws.ec2", "EC2 Capacity Reservation Instance Interruption Warning"),
)


@dataclass(frozen=True)
class PoolSettings:
    gpu_instance_families: list[str]
    gpu_instance_types: list[str]
    capacity_types: list[str]
    gpu_limit: int
    gpu_cpu_limit: int
    smoke_cpu_limit: int


def controller_statements(*, cluster_name: str, node_role_arn: str, queue_arn: str) -> list[iam.PolicyStatement]:
    partition, region, account = Aws.PARTITION, Aws.REGION, Aws.ACCOUNT_ID

    def ec2(resource: str, *, scoped_account: bool = True) -> str:
        return f"arn:{partition}:ec2:{region}:{'*' if scoped_account else ''}:{resource}"

    owned = f"kubernetes.io/cluster/{cluster_name}"
    instance_profile = f"arn:{partition}:iam::{account}:instance-profile/*"
    cluster_arn = f"arn:{partition}:eks:{region}:{account}:cluster/{cluster_name}"
    created = [
        "fleet/*",
        "instance/*",
        "volume/*",
        "network-interface/*",
        "launch-template/*",
        "spot-instances-request/*",
    ]
    return [
        # --- node lifecycle
        iam.PolicyStatement(
            sid="AllowScopedEC2InstanceAccessActions",
            actions=["ec2:RunInstances", "ec2:CreateFleet"],
            resources=[
                ec2("image/*", scoped_account=False),
                ec2("snapshot/*", scoped_account=False),
                ec2("security-group/*"),
                ec2("subnet/*"),
                ec2("capacity-reservation/*"),
                ec2("placement-group/*"),
            ],
        ),
        iam.PolicyStatement(
            sid="AllowScopedEC2LaunchTemplateAccessActions",
            actions=["ec2:RunInstances", "ec2:CreateFleet"],
            resources=[ec2("launch-template/*")],
            conditions={
                "StringEquals": {f"aws:ResourceTag/{owned}": "owned"},
                "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
            },
        ),
        iam.PolicyStatement(
            sid="AllowScopedEC2InstanceActionsWithTags",
            actions=["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
            resources=[ec2(r) for r in created],
            conditions={
                "StringEquals": {
                    f"aws:RequestTag/{owned}": "owned",
                    "aws:RequestTag/eks:eks-cluster-name": cluster_name,
                },
                "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"},
            },
        ),
        iam.PolicyStatement(
            sid="AllowScopedResourceCreationTagging",
            actions=["ec2:CreateTags"],
            resources=[ec2(r) for r in created],
            conditions={
                "StringEquals": {
                    f"aws:RequestTag/{owned}": "owned",
                    "aws:RequestTag/eks:eks-cluster-name": cluster_name,
                    "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"],
                },
                "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"},
            },
        ),
        iam.PolicyStatement(
            sid="AllowScopedResourceTagging",
            actions=["ec2:CreateTags"],
            resources=[ec2("instance/*")],
            conditions={
                "StringEquals": {f"aws:ResourceTag/{owned}": "owned"},
                "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
                "StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": cluster_name},
                "ForAllValues:StringEquals": {
                    "aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim", "Name"]
                },
            },
        ),
        iam.PolicyStatement(
            sid="AllowScopedDeletion",
            actions=["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
            resources=[ec2("instance/*"), ec2("launch-template/*")],
            conditions={
                "StringEquals": {f"aws:ResourceTag/{owned}": "owned"},
                "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
            },
        ),
        # --- IAM integration
        iam.PolicyStatement(
            sid="AllowPassingInstanceRole",
            actions=["iam:PassRole"],
            resources=[node_role_arn],
            conditions={"StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]}},
        ),
        iam.PolicyStatement(
            sid="AllowScopedInstanceProfileCreationActions",
            actions=["iam:CreateInstanceProfile"],
            resources=[instance_profile],
            conditions={
                "StringEquals": {
                    f"aws:RequestTag/{owned}": "owned",
                    "aws:RequestTag/eks:eks-cluster-name": cluster_name,
                    "aws:RequestTag/topology.kubernetes.io/region": region,
                },
                "StringLike": {"aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"},
            },
        ),
        iam.PolicyStatement(
            sid="AllowScopedInstanceProfileTagActions",
            actions=["iam:TagInstanceProfile"],
            resources=[instance_profile],
            conditions={
                "StringEquals": {
                    f"aws:ResourceTag/{owned}": "owned",
                    "aws:ResourceTag/topology.kubernetes.io/region": region,
                    f"aws:RequestTag/{owned}": "owned",
                    "aws:RequestTag/eks:eks-cluster-name": cluster_name,
                    "aws:RequestTag/topology.kubernetes.io/region": region,
                },
                "StringLike": {
                    "aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*",
                    "aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*",
                },
            },
        ),
        iam.PolicyStatement(
            sid="AllowScopedInstanceProfileActions",
            actions=["iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"],
            resources=[instance_profile],
            conditions={
                "StringEquals": {
                    f"aws:ResourceTag/{owned}": "owned",
                    "aws:ResourceTag/topology.kubernetes.io/region": region,
                },
                "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*"},
            },
        ),
        iam.PolicyStatement(
            sid="AllowInstanceProfileReadActions",
            actions=["iam:GetInstanceProfile"],
            resources=[instance_profile],
        ),
        # ListInstanceProfiles has no resource type: scoped to instance-profile/* it never matches.
        iam.PolicyStatement(
            sid="AllowUnscopedInstanceProfileListAction",
            actions=["iam:ListInstanceProfiles"],
            resources=["*"],
        ),
        # --- EKS integration
        iam.PolicyStatement(
            sid="AllowAPIServerEndpointDiscovery",
            actions=["eks:DescribeCluster"],
            resources=[cluster_arn],
        ),
        # --- interruption
        iam.PolicyStatement(
            sid="AllowInterruptionQueueActions",
            actions=["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"],
            resources=[queue_arn],
        ),
        # --- zonal shift
        # The managed resource is named by a condition key, not by the statement's Resource.
        iam.PolicyStatement(
            sid="AllowZonalShiftStatusReadOnly",
            actions=["arc-zonal-shift:GetManagedResource"],
            resources=["*"],
            conditions={"StringEquals": {"arc-zonal-shift:ResourceIdentifier": cluster_arn}},
        ),
        # --- resource discovery
        iam.PolicyStatement(
            sid="AllowRegionalReadActions",
            actions=[
                "ec2:DescribeCapacityReservations",
                "ec2:DescribeImages",
                "ec2:DescribeInstances",
                "ec2:DescribeInstanceStatus",
                "ec2:DescribeInstanceTypeOfferings",
                "ec2:DescribeInstanceTypes",
                "ec2:DescribeLaunchTemplates",
                "ec2:DescribePlacementGroups",
                "ec2:DescribeSecurityGroups",
                "ec2:DescribeSpotPriceHistory",
                "ec2:DescribeSubnets",
            ],
            resources=["*"],
            conditions={"StringEquals": {"aws:RequestedRegion": region}},
        ),
        iam.PolicyStatement(
            sid="AllowSSMReadActions",
            actions=["ssm:GetParameter"],
            resources=[f"arn:{partition}:ssm:{region}::parameter/aws/service/*"],
        ),
        iam.PolicyStatement(sid="AllowPricingReadActions", actions=["pricing:GetProducts"], resources=["*"]),
    ]


class Karpenter(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        cluster_name: str,
        team: str,
        pools: PoolSettings,
        controller_replicas: int,
        node_ami_alias: str,
        node_role_name: str,
    ) -> None:
        """`cluster_name` is the plain name (IAM condition keys cannot hold a token). `node_role_name` is
        fixed, as upstream's is, so other stacks can name the node role without a reference to it."""
        super().__init__(scope, construct_id)
        tag_component(self, "karpenter")

        self.queue = sqs.Queue(
            self,
            "InterruptionQueue",
            retention_period=Duration.seconds(300),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
        )
        # Deliberate deviation from upstream: no blanket send grant to events/sqs. Each rule's target
        # adds its own statement with aws:SourceArn, so only these five rules can send.
        self.rules = {
            rule_id: events.Rule(
                self,
                f"{rule_id}Rule",
                event_pattern=events.EventPattern(source=[source], detail_type=[detail_type]),
                targets=[targets.SqsQueue(self.queue)],
            )
            for rule_id, source, detail_type in INTERRUPTION_RULES
        }

        self.node_role = iam.Role(
            self,
            "NodeRole",
            role_name=node_role_name,
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(n) for n in NODE_MANAGED_POLICIES],
        )
        # EC2_LINUX, not STANDARD: a standard entry breaks node join (karpenter issue 7558).
        self.node_access = eks.AccessEntry(
            self,
            "NodeAccess",
            cluster=cast(eks.ICluster, cluster),  # jsii's protocol lags the class
            principal=self.node_role.role_arn,
            access_policies=[],
            access_entry_type=eks.AccessEntryType.EC2_LINUX,
        )

        self.service_account = cluster.add_service_account(
            "ControllerServiceAccount",
            name=SERVICE_ACCOUNT,
            namespace=NAMESPACE,
            identity_type=eks.IdentityType.POD_IDENTITY,
        )
        # CDK's role trusts every Pod Identity association of the account: only this cluster's controller may take it.
        scope_pod_identity_trust(
            self.service_account.role, cluster_name=cluster_name, namespace=NAMESPACE, service_account=SERVICE_ACCOUNT
        )
        self.controller_policy = iam.Policy(
            self,
            "ControllerPolicy",
            roles=[self.service_account.role],
            statements=controller_statements(
                cluster_name=cluster_name, node_role_arn=self.node_role.role_arn, queue_arn=self.queue.queue_arn
            ),
        )
        self.crd_chart = cluster.add_helm_chart(
            "CrdChart",
            chart=CRD_CHART,
            repository=CRD_CHART_REPOSITORY,
            version=CHART_VERSION,
            namespace=NAMESPACE,
            release="karpenter-crd",
            wait=False,
        )
        self.chart = cluster.add_helm_chart(
            "Chart",
            chart=CHART,
            repository=CHART_REPOSITORY,
            version=CHART_VERSION,
            namespace=NAMESPACE,
            release="karpenter",
            skip_crds=True,  # installed and upgraded by the karpenter-crd chart
            wait=False,  # a helm wait can outlive the 15-minute handler (aws-cdk 22257)
            values={
                "settings": {
                    "clusterName": cluster_name,
                    "interruptionQueue": self.queue.queue_name,
                    # Alpha, off by default: replaces a node whose GPU (the node monitoring agent's
                    # AcceleratedHardwareReady) or kubelet failed, after 10 or 30 min, rather than leave a
                    # training job to crash on it again; `beacon doctor` names it (node-repaired).
                    "featureGates": {"nodeRepair": True},
                },
                "serviceAccount": {"create": False, "name": SERVICE_ACCOUNT},
                "replicas": controller_replicas,
                # On the system node group, never on a node Karpenter itself manages.
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}]}
                            ]
                        }
                    }
                },
                "controller": {"resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}},
            },
        )
        self.chart.node.add_dependency(self.crd_chart, self.service_account, self.controller_policy)

        role_name = self.node_role.role_name
        self.node_classes = {
            name: km.node_class(km.NodeClassSpec(name, cluster_name, role_name, gib, team, node_ami_alias))
            for name, gib in ((km.GPU_NODE_CLASS, 200), (km.CPU_NODE_CLASS, 50))
        }
        self.node_pools = {
            "gpu": km.gpu_training_pool(
                instance_families=pools.gpu_instance_families,
                instance_types=pools.gpu_instance_types,
                capacity_types=pools.capacity_types,
                gpu_limit=pools.gpu_limit,
                cpu_limit=pools.gpu_cpu_limit,
            ),
            "cpu": km.cpu_smoke_pool(capacity_types=pools.capacity_types, cpu_limit=pools.smoke_cpu_limit),
        }
        # Order: CRD chart -> controller chart -> node classes -> node pools. CloudFormation deletes in reverse, so on
        # destroy the pools go first and Karpenter, still running, terminates every node it launched.
        self.node_class_manifest = cluster.add_manifest("NodeClasses", *self.node_classes.values())
        self.node_class_manifest.node.add_dependency(self.crd_chart, self.chart)
        self.node_pool_manifest = cluster.add_manifest("NodePools", *self.node_pools.values())
        self.node_pool_manifest.node.add_dependency(self.node_class_manifest)
        self._acknowledge()

    def _acknowledge(self) -> None:
        reasons = {
            "AmazonEKS_CNI_Policy": "the VPC CNI on Karpenter nodes needs it",
            "AmazonEKSWorkerNodePolicy": "EKS worker nodes need it to join",
            "AmazonEC2ContainerRegistryPullOnly": "nodes pull the training image from ECR",
            "AmazonSSMManagedInstanceCore": "Session Manager access to nodes instead of SSH",
        }
        for name, reason in reasons.items():
            acknowledge(
                self.node_role,
                f"IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]",
                f"Upstream Karpenter node role policy: {reason}.",
            )
        acknowledge(
            self.controller_policy,
            "IAM5[Resource::*]",
            "Karpenter's discovery (ec2:Describe*, region-conditioned), pricing:GetProducts and "
            "iam:ListInstanceProfiles have no resource type; the zonal-shift read is conditioned on the cluster.",
        )
        for resource in self._wildcard_resources():
            acknowledge(
                self.controller_policy,
                f"IAM5[Resource::{resource}]",
                "Upstream Karpenter controller policy: instances, fleets and profiles are created at run time, "
                "and every such statement is conditioned on the cluster's ownership tags.",
            )
        acknowledge(self.queue, "SQS3", "The interruption queue is Karpenter's own dead end; events are advisory.")

    @staticmethod
    def _wildcard_resources() -> list[str]:
        base = "arn:<AWS::Partition>:ec2:<AWS::Region>:"
        names = [
            "image/*",
            "snapshot/*",
        ]
        resources = [f"{base}:{n}" for n in names]
        resources += [
            f"{base}*:{n}"
            for n in (
                "security-group/*",
                "subnet/*",
                "capacity-reservation/*",
                "placement-group/*",
                "launch-template/*",
                "fleet/*",
                "instance/*",
                "volume/*",
                "network-interface/*",
                "spot-instances-request/*",
            )
        ]
        resources += [
            "arn:<AWS::Partition>:iam::<AWS::AccountId>:instance-profile/*",
            "arn:<AWS::Partition>:ssm:<AWS::Region>::parameter/aws/service/*",
        ]
        return resources
