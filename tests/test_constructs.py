"""One test per construct, in the style of cdklabs' testing examples: the construct alone in a bare
Stack (with only what it is given), then `Template.from_stack`. The stacks' tests show how they are
wired; these show what each construct promises by itself."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from aws_cdk import App, Duration, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Match, Template
from beacon import contract

from beacon_constructs.artifact_store import ArtifactStore
from beacon_constructs.bastion import ClusterBastion
from beacon_constructs.cluster import EFS_CSI_ADDON, TrainingCluster
from beacon_constructs.gpu_device_plugin import NvidiaDevicePlugin
from beacon_constructs.karpenter import Karpenter, PoolSettings
from beacon_constructs.monitoring import TrainingMonitoring
from beacon_constructs.network import TrainingNetwork
from beacon_constructs.smoke_job import SmokeJob
from beacon_constructs.training_namespace import TrainingNamespace
from beacon_constructs.volume import ArtifactVolume
from config import names
from tests.support.synth import ROOT
from workloads import manifests

ENV = {"account": "111122223333", "region": "us-east-1"}
CLUSTER = "beacon-demo"


def bare_stack(name: str = "Bare") -> Stack:
    """A Stack in an App with the project's feature flags (cdk.json), and nothing else."""
    flags = json.loads((ROOT / "cdk.json").read_text())["context"]
    return Stack(App(context=flags), name, env=ENV)


def vpc_in(stack: Stack) -> ec2.Vpc:
    return ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=0)


def resources(template: Template, kind: str) -> list[Mapping[str, Any]]:
    return list(template.find_resources(kind).values())


def test_artifact_store_is_a_versioned_encrypted_retained_bucket_with_a_writer_and_a_reader() -> None:
    stack = bare_stack()
    store = ArtifactStore(
        stack,
        "Store",
        noncurrent_version_retention=Duration.days(30),
        abort_incomplete_multipart_after=Duration.days(1),
        metric_namespace=contract.metric_namespace("demo"),
        cluster_name=CLUSTER,
        training_namespace=contract.TRAINING_NAMESPACE,
        training_service_account=manifests.TRAINING_SERVICE_ACCOUNT,
        cluster_log_group=names.container_log_group(CLUSTER),
        training_job_log_group=names.SAGEMAKER_LOG_GROUP,
        training_job_prefix=names.training_job_prefix("demo"),
        reader_role_arns=[],
        reader_tag=names.reader_tag("demo"),
    )
    template = Template.from_stack(stack)
    template.has_resource(
        "AWS::S3::Bucket",
        {
            "DeletionPolicy": "Retain",
            "Properties": Match.object_like(
                {
                    "VersioningConfiguration": {"Status": "Enabled"},
                    "BucketEncryption": Match.object_like(
                        {
                            "ServerSideEncryptionConfiguration": Match.array_with(
                                [
                                    Match.object_like(
                                        {
                                            "ServerSideEncryptionByDefault": Match.object_like(
                                                {"SSEAlgorithm": "aws:kms"}
                                            )
                                        }
                                    )
                                ]
                            )
                        }
                    ),
                }
            ),
        },
    )
    assert store.writer_role is not store.reader_role
    trust = json.dumps(template.to_json()["Resources"][stack.get_logical_id(store.writer_role.node.default_child)])  # type: ignore[arg-type]
    assert "pods.eks.amazonaws.com" in trust, "the writer is assumed by the training pods' identity"


def test_artifact_volume_is_encrypted_retained_and_its_access_point_owns_files_as_the_job_runs() -> None:
    stack = bare_stack()
    vpc = vpc_in(stack)
    clients = ec2.SecurityGroup(stack, "Nodes", vpc=vpc)
    ArtifactVolume(
        stack,
        "Volume",
        vpc=vpc,
        subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED),
        client_security_group=clients,
        uid=1000,
        gid=2000,
    )
    template = Template.from_stack(stack)
    template.has_resource(
        "AWS::EFS::FileSystem", {"DeletionPolicy": "Retain", "Properties": Match.object_like({"Encrypted": True})}
    )
    template.has_resource_properties(
        "AWS::EFS::AccessPoint",
        {
            "PosixUser": {"Uid": "1000", "Gid": "2000"},
            "RootDirectory": Match.object_like(
                {"CreationInfo": {"OwnerUid": "1000", "OwnerGid": "2000", "Permissions": Match.any_value()}}
            ),
        },
    )
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {"FromPort": 2049, "ToPort": 2049, "SourceSecurityGroupId": Match.any_value()},
    )


def test_training_network_has_private_node_subnets_flow_logs_and_the_s3_gateway() -> None:
    stack = bare_stack()
    network = TrainingNetwork(
        stack,
        "Network",
        cidr="10.40.0.0/16",
        az_count=2,
        availability_zones=None,
        extra_endpoints=False,
        cluster_name=CLUSTER,
        flow_log_retention_days=30,
    )
    template = Template.from_stack(stack)
    template.has_resource_properties("AWS::EC2::VPC", {"CidrBlock": "10.40.0.0/16"})
    template.has_resource_properties("AWS::EC2::FlowLog", Match.object_like({"TrafficType": "ALL"}))
    template.has_resource_properties("AWS::EC2::VPCEndpoint", Match.object_like({"VpcEndpointType": "Gateway"}))
    assert network.node_subnets is not None and network.node_security_group is not None


def test_training_monitoring_topic_lets_cloudwatch_publish_through_its_key() -> None:
    """The review's finding: alarms could not publish to an encrypted topic whose key CloudWatch may not use."""
    stack = bare_stack()
    monitoring = TrainingMonitoring(
        stack, "Monitoring", team="demo", cluster_name=CLUSTER, alarm_emails=[], alarm_topic_arns=[]
    )
    template = Template.from_stack(stack)
    (key,) = resources(template, "AWS::KMS::Key")
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    cloudwatch = [s for s in statements if s.get("Principal", {}).get("Service") == "cloudwatch.amazonaws.com"]
    assert cloudwatch and {"kms:Decrypt", "kms:GenerateDataKey*"} <= set(cloudwatch[0]["Action"])
    template.has_resource_properties("AWS::SNS::Topic", {"KmsMasterKeyId": Match.any_value()})
    assert monitoring.team_alarms, "the team's alarms come with the construct"


def test_cluster_bastion_takes_no_inbound_traffic_and_is_reached_through_ssm() -> None:
    stack = bare_stack()
    vpc = vpc_in(stack)
    ClusterBastion(stack, "Bastion", vpc=vpc, subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED))
    template = Template.from_stack(stack)
    for group in resources(template, "AWS::EC2::SecurityGroup"):
        assert not group["Properties"].get("SecurityGroupIngress"), "no inbound rule at all"
    policies = json.dumps(resources(template, "AWS::IAM::Policy"))
    assert "ssmmessages:" in policies, "its SSM agent's session channels: the only way in"


@pytest.fixture(scope="module")
def with_cluster() -> tuple[Stack, TrainingCluster]:
    """The constructs that run on a cluster get one; everything else about the stack stays bare."""
    stack = bare_stack("BareWithCluster")
    vpc = vpc_in(stack)
    training_cluster = TrainingCluster(
        stack,
        "Cluster",
        cluster_name=CLUSTER,
        kubernetes_version="1.35",
        vpc=vpc,
        subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED),
        public_access_cidrs=["203.0.113.0/24"],
        system_node_instance_type="m7i.large",
        system_node_count=2,
        log_retention_days=30,
        container_insights_log_groups=names.container_insights_log_groups(CLUSTER),
    )
    return stack, training_cluster


@pytest.fixture(scope="module")
def cluster_constructs(with_cluster: tuple[Stack, TrainingCluster]) -> dict[str, Any]:
    stack, training_cluster = with_cluster
    cluster = training_cluster.cluster
    karpenter = Karpenter(
        stack,
        "Karpenter",
        cluster=cluster,
        cluster_name=CLUSTER,
        team="demo",
        pools=PoolSettings(
            gpu_instance_families=["g6"],
            gpu_instance_types=[],
            capacity_types=["on-demand"],
            gpu_limit=8,
            gpu_cpu_limit=192,
            smoke_cpu_limit=16,
        ),
        controller_replicas=2,
        node_ami_alias="al2023@latest",
        node_role_name=names.karpenter_node_role_name("demo"),
    )
    from beacon_constructs.karpenter_manifests import pool_node_labels, pool_node_taints

    plugin = NvidiaDevicePlugin(
        stack,
        "GpuDevicePlugin",
        cluster=cluster,
        node_labels=pool_node_labels(karpenter.node_pools["gpu"]),
        node_taints=pool_node_taints(karpenter.node_pools["gpu"]),
    )
    writer = iam.Role(stack, "Writer", assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com"))
    from aws_cdk import aws_efs as efs

    file_system = efs.FileSystem(stack, "Fs", vpc=cluster.vpc, removal_policy=RemovalPolicy.DESTROY)
    access_point = file_system.add_access_point("Ap", posix_user=efs.PosixUser(uid="1000", gid="1000"))
    namespace = TrainingNamespace(
        stack,
        "Training",
        cluster=cluster,
        writer_role=writer,
        file_system=file_system,
        access_point=access_point,
        depends_on_storage_driver=training_cluster.addons[EFS_CSI_ADDON],
        operator_role_arns=[],
    )
    spec = manifests.SmokeJobSpec(team="demo", image="", bucket="b", region="us-east-1", uid=1000, gid=1000)
    smoke = SmokeJob(
        stack, "SmokeJob", cluster=cluster, spec=spec, platform="linux/amd64", after=[namespace.service_account]
    )
    return {"template": Template.from_stack(stack), "karpenter": karpenter, "plugin": plugin, "smoke": smoke}


def test_training_cluster_runs_the_efs_driver_with_its_own_identity_and_keeps_control_plane_logs(
    with_cluster: tuple[Stack, TrainingCluster], cluster_constructs: dict[str, Any]
) -> None:
    _stack, training_cluster = with_cluster
    assert EFS_CSI_ADDON in training_cluster.addons
    template = cluster_constructs["template"]  # the one synthesis of the stack the cluster is in
    template.has_resource_properties(
        "AWS::EKS::Addon",
        Match.object_like({"AddonName": EFS_CSI_ADDON, "PodIdentityAssociations": Match.any_value()}),
    )
    template.has_resource_properties(
        "AWS::EKS::Cluster", Match.object_like({"Logging": Match.object_like({"ClusterLogging": Match.any_value()})})
    )


def test_karpenter_has_an_interruption_queue_fed_by_its_rules_and_a_gpu_pool(
    cluster_constructs: dict[str, Any],
) -> None:
    template, karpenter = cluster_constructs["template"], cluster_constructs["karpenter"]
    template.has_resource_properties("AWS::SQS::Queue", Match.object_like({"MessageRetentionPeriod": 300}))
    assert len(karpenter.rules) >= 4, "spot interruption, rebalance, state change, scheduled change"
    assert "gpu" in karpenter.node_pools


def test_the_gpu_device_plugin_tolerates_exactly_the_gpu_pools_taints(cluster_constructs: dict[str, Any]) -> None:
    karpenter, plugin = cluster_constructs["karpenter"], cluster_constructs["plugin"]
    from beacon_constructs.karpenter_manifests import pool_node_taints

    taints = pool_node_taints(karpenter.node_pools["gpu"])
    assert taints, "the GPU pool is tainted"
    for taint in taints:
        assert any(t.get("key") == taint["key"] for t in plugin.tolerations), taint


def test_the_training_namespace_binds_the_writer_role_to_the_training_service_account(
    cluster_constructs: dict[str, Any],
) -> None:
    template = cluster_constructs["template"]
    template.has_resource_properties(
        "AWS::EKS::PodIdentityAssociation",
        Match.object_like(
            {"Namespace": contract.TRAINING_NAMESPACE, "ServiceAccount": manifests.TRAINING_SERVICE_ACCOUNT}
        ),
    )


def test_the_smoke_job_construct_ships_the_spec_it_was_given(cluster_constructs: dict[str, Any]) -> None:
    smoke = cluster_constructs["smoke"]
    (job,) = [item for item in smoke.objects if item["kind"] == "Job"]
    assert job["metadata"]["name"] == smoke.spec.name
    assert job["metadata"]["namespace"] == contract.TRAINING_NAMESPACE
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["livenessProbe"] and container["startupProbe"], "every pod carries its per-rank probes"
