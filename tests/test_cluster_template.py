"""The cluster stack as synthesized: EKS (aws_eks_v2, which cdk-nag's EKS rules do not cover),
Karpenter, the training namespace and volume objects, and the smoke Job."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Match, Template
from beacon import contract

from beacon_constructs.cluster import TrainingCluster
from beacon_constructs.karpenter import INTERRUPTION_RULES, NODE_MANAGED_POLICIES
from beacon_ops.doctor.eks_state import NODE_EVENTS_NAMESPACE
from beacon_ops.templates import Template as SynthesizedTemplate
from beacon_ops.templates import kubernetes_objects, shape_resolver
from config import TeamConfig, names
from tests.support.moto_server import MotoServer
from tests.support.synth import ROOT, Synthesized, synthesize
from workloads import manifests

KUBERNETES = "1.35.0"


@pytest.fixture(scope="module")
def cluster(demo: Synthesized) -> SynthesizedTemplate:
    return demo.template("cluster")


@pytest.fixture(scope="module")
def template(demo: Synthesized) -> Template:
    return demo.assertions("beacon-demo-cluster")


@pytest.fixture(scope="module")
def objects(cluster: SynthesizedTemplate) -> dict[str, list[dict[str, Any]]]:
    return kubernetes_objects(cluster)


def all_objects(objects: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [o for group in objects.values() for o in group]


def one(objects: dict[str, list[dict[str, Any]]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in all_objects(objects) if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# --- EKS ------------------------------------------------------------------------------------
def test_cluster_runs_the_configured_version_without_auto_mode(cluster: SynthesizedTemplate) -> None:
    (eks,) = cluster.of_type("AWS::EKS::Cluster").values()
    properties = eks["Properties"]
    assert properties["Version"] == "1.35"
    assert properties["Name"] == "beacon-demo"
    assert properties.get("ComputeConfig", {}).get("Enabled", False) is False
    assert properties["BootstrapSelfManagedAddons"] is False


def test_endpoint_is_private_by_default(cluster: SynthesizedTemplate) -> None:
    (eks,) = cluster.of_type("AWS::EKS::Cluster").values()
    vpc_config = eks["Properties"]["ResourcesVpcConfig"]
    assert vpc_config["EndpointPrivateAccess"] is True
    assert vpc_config["EndpointPublicAccess"] is False


def test_a_public_endpoint_is_opened_only_to_the_allow_list() -> None:
    stack = Stack(App(), "PublicProbe")
    vpc = ec2.Vpc(stack, "Vpc")
    TrainingCluster(
        stack,
        "Cluster",
        cluster_name="beacon-probe",
        kubernetes_version="1.35",
        vpc=vpc,
        subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
        public_access_cidrs=["203.0.113.0/24"],
        system_node_instance_type="m7i.large",
        system_node_count=2,
        log_retention_days=30,
        container_insights_log_groups=names.container_insights_log_groups("beacon-probe"),
    )
    Template.from_stack(stack).has_resource_properties(
        "AWS::EKS::Cluster",
        {
            "ResourcesVpcConfig": Match.object_like(
                {"EndpointPublicAccess": True, "EndpointPrivateAccess": True, "PublicAccessCidrs": ["203.0.113.0/24"]}
            )
        },
    )


def test_all_five_control_plane_log_types_are_on_with_the_configured_retention(
    cluster: SynthesizedTemplate, template: Template, demo: Synthesized
) -> None:
    (eks,) = cluster.of_type("AWS::EKS::Cluster").values()
    enabled = {t["Type"] for t in eks["Properties"]["Logging"]["ClusterLogging"]["EnabledTypes"]}
    assert enabled == {"api", "audit", "authenticator", "controllerManager", "scheduler"}
    template.has_resource_properties(
        "AWS::Logs::LogGroup",
        {"LogGroupName": "/aws/eks/beacon-demo/cluster", "RetentionInDays": demo.config.monitoring.log_retention_days},
    )


def test_secrets_are_envelope_encrypted_with_a_rotating_key(cluster: SynthesizedTemplate, template: Template) -> None:
    (eks,) = cluster.of_type("AWS::EKS::Cluster").values()
    (encryption,) = eks["Properties"]["EncryptionConfig"]
    assert encryption["Resources"] == ["secrets"]
    key_id = encryption["Provider"]["KeyArn"]["Fn::GetAtt"][0]
    assert cluster.resources[key_id]["Properties"]["EnableKeyRotation"] is True


def test_a_small_managed_system_node_group_hosts_the_add_ons(template: Template, demo: Synthesized) -> None:
    template.has_resource_properties(
        "AWS::EKS::Nodegroup",
        {
            "InstanceTypes": [demo.config.cluster.system_node_instance_type],
            "ScalingConfig": Match.object_like({"DesiredSize": demo.config.cluster.system_node_count}),
        },
    )


def test_the_add_ons_are_the_seven_the_platform_needs(cluster: SynthesizedTemplate) -> None:
    names = {a["Properties"]["AddonName"] for a in cluster.of_type("AWS::EKS::Addon").values()}
    assert names == {
        "vpc-cni",
        "coredns",
        "kube-proxy",
        "eks-pod-identity-agent",
        "aws-efs-csi-driver",
        "amazon-cloudwatch-observability",
        "eks-node-monitoring-agent",  # the GPU's and the node's health conditions, which node repair acts on
    }


def test_pod_identity_binds_karpenter_efs_csi_observability_and_training(cluster: SynthesizedTemplate) -> None:
    bound = {
        (a["Properties"]["Namespace"], a["Properties"]["ServiceAccount"]): a["Properties"]["RoleArn"]
        for a in cluster.of_type("AWS::EKS::PodIdentityAssociation").values()
    }
    assert set(bound) == {
        ("kube-system", "karpenter"),
        ("kube-system", "efs-csi-node-sa"),  # mounts the volume with IAM (mountOptions: [iam, tls])
        ("training", "training"),
    }, "the add-ons' own service accounts are bound by their add-ons (test below)"
    assert "WriterRole" in json.dumps(bound[("training", "training")])  # the artifact store's writer
    assert cluster.of_type("AWS::IAM::OIDCProvider") == {}, "Pod Identity, not IRSA"


def test_add_ons_carry_their_own_pod_identity_association(cluster: SynthesizedTemplate) -> None:
    """On the add-on itself, the association exists before the add-on's pods start (no ordering race)."""
    addons = {a["Properties"]["AddonName"]: a["Properties"] for a in cluster.of_type("AWS::EKS::Addon").values()}
    expected = {
        "aws-efs-csi-driver": ("efs-csi-controller-sa", "EfsCsiRole"),
        "amazon-cloudwatch-observability": ("cloudwatch-agent", "ObservabilityRole"),
    }
    for name, (service_account, role) in expected.items():
        (association,) = addons[name]["PodIdentityAssociations"]
        assert association["ServiceAccount"] == service_account
        assert role in json.dumps(association["RoleArn"])


def test_the_system_node_group_waits_for_the_node_networking_add_ons(cluster: SynthesizedTemplate) -> None:
    """BootstrapSelfManagedAddons is false: without vpc-cni (and kube-proxy) no node becomes Ready."""
    addon_ids = {a["Properties"]["AddonName"]: k for k, a in cluster.of_type("AWS::EKS::Addon").items()}
    (nodegroup_id,) = cluster.of_type("AWS::EKS::Nodegroup")
    waits_for = depends_on(cluster, nodegroup_id)
    assert addon_ids["vpc-cni"] in waits_for
    assert addon_ids["kube-proxy"] in waits_for


def test_access_is_through_access_entries_only_and_karpenter_nodes_join_as_ec2_linux(
    cluster: SynthesizedTemplate, objects: dict[str, list[dict[str, Any]]]
) -> None:
    entries = [e["Properties"] for e in cluster.of_type("AWS::EKS::AccessEntry").values()]
    node_entry = [e for e in entries if "KarpenterNodeRole" in json.dumps(e["PrincipalArn"])]
    assert len(node_entry) == 1 and node_entry[0]["Type"] == "EC2_LINUX"
    (eks,) = cluster.of_type("AWS::EKS::Cluster").values()
    assert eks["Properties"]["AccessConfig"]["AuthenticationMode"] == "API"
    assert not [o for o in all_objects(objects) if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "aws-auth"]


def test_operator_roles_may_edit_the_training_namespace_and_nothing_else(
    demo_config: TeamConfig, tmp_path: Path
) -> None:
    """Who runs `beacon smoke` gets an access entry scoped to `training`; the demo lists nobody."""
    operator = "arn:aws:iam::123456789012:role/ml-vision-operators"
    config = demo_config.model_copy(
        update={"cluster": demo_config.cluster.model_copy(update={"operator_role_arns": (operator,)})}
    )
    cluster = synthesize(config, tmp_path).template("cluster")
    entries = [e["Properties"] for e in cluster.of_type("AWS::EKS::AccessEntry").values()]
    (entry,) = [e for e in entries if e["PrincipalArn"] == operator]
    (policy,) = entry["AccessPolicies"]
    assert policy["AccessScope"] == {"Type": "namespace", "Namespaces": [contract.TRAINING_NAMESPACE]}
    assert json.dumps(policy["PolicyArn"]).endswith('cluster-access-policy/AmazonEKSEditPolicy"]]}')
    assert entry.get("Type", "STANDARD") == "STANDARD"


def test_kubectl_provider_uses_the_layer_matching_the_cluster_version(cluster: SynthesizedTemplate) -> None:
    layers = cluster.of_type("AWS::Lambda::LayerVersion")
    assert any("kubectl" in json.dumps(layer["Properties"]).lower() for layer in layers.values())
    handlers = [f for f in cluster.of_type("AWS::Lambda::Function").values() if "VpcConfig" in f["Properties"]]
    assert handlers, "the kubectl handler runs inside the VPC to reach the private endpoint"


# --- Karpenter ---------------------------------------------------------------------------------
def helm_chart(cluster: SynthesizedTemplate, name: str) -> tuple[str, dict[str, Any]]:
    (found,) = [
        (k, c) for k, c in cluster.of_type("Custom::AWSCDK-EKS-HelmChart").items() if c["Properties"]["Chart"] == name
    ]
    return found


def test_karpenter_chart_is_pinned_from_the_oci_registry_with_cluster_and_queue_names(
    cluster: SynthesizedTemplate,
) -> None:
    _, chart = helm_chart(cluster, "karpenter")
    properties = chart["Properties"]
    assert properties["Repository"] == "oci://public.ecr.aws/karpenter/karpenter"
    assert (properties["Chart"], properties["Version"], properties["Namespace"]) == (
        "karpenter",
        "1.14.1",
        "kube-system",
    )
    values = json.loads(shape_resolver().resolve(properties["Values"]))
    (queue_id,) = cluster.of_type("AWS::SQS::Queue")
    assert values["settings"] == {
        "clusterName": "beacon-demo",
        "interruptionQueue": f"<{queue_id}.QueueName>",
        "featureGates": {"nodeRepair": True},  # alpha in the chart (values.yaml: nodeRepair: false)
    }
    assert values["serviceAccount"] == {"create": False, "name": "karpenter"}
    terms = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}]}]


def controller_statements(cluster: SynthesizedTemplate) -> dict[str, dict[str, Any]]:
    (policy,) = [
        p
        for logical_id, p in cluster.of_type("AWS::IAM::Policy").items()
        if logical_id.startswith("KarpenterController")
    ]
    return {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}


UPSTREAM_GROUPS = {
    "node lifecycle": [
        "AllowScopedEC2InstanceAccessActions",
        "AllowScopedEC2LaunchTemplateAccessActions",
        "AllowScopedEC2InstanceActionsWithTags",
        "AllowScopedResourceCreationTagging",
        "AllowScopedResourceTagging",
        "AllowScopedDeletion",
    ],
    "iam integration": [
        "AllowPassingInstanceRole",
        "AllowScopedInstanceProfileCreationActions",
        "AllowScopedInstanceProfileTagActions",
        "AllowScopedInstanceProfileActions",
    ],
    "eks integration": ["AllowAPIServerEndpointDiscovery"],
    "interruption": ["AllowInterruptionQueueActions"],
    "zonal shift": ["AllowZonalShiftStatusReadOnly"],
    "resource discovery": [
        "AllowRegionalReadActions",
        "AllowSSMReadActions",
        "AllowPricingReadActions",
        "AllowUnscopedInstanceProfileListAction",
        "AllowInstanceProfileReadActions",
    ],
}


def test_controller_policy_carries_every_upstream_action_group(cluster: SynthesizedTemplate) -> None:
    statements = controller_statements(cluster)
    assert sorted(statements) == sorted(sid for sids in UPSTREAM_GROUPS.values() for sid in sids)


def test_controller_policy_scopes_creation_and_deletion_by_the_clusters_tags(cluster: SynthesizedTemplate) -> None:
    statements = controller_statements(cluster)
    owned = "kubernetes.io/cluster/beacon-demo"
    with_tags = statements["AllowScopedEC2InstanceActionsWithTags"]["Condition"]
    assert with_tags["StringEquals"] == {
        f"aws:RequestTag/{owned}": "owned",
        "aws:RequestTag/eks:eks-cluster-name": "beacon-demo",
    }
    assert with_tags["StringLike"] == {"aws:RequestTag/karpenter.sh/nodepool": "*"}
    tagging = statements["AllowScopedResourceCreationTagging"]["Condition"]["StringEquals"]
    assert tagging["ec2:CreateAction"] == ["RunInstances", "CreateFleet", "CreateLaunchTemplate"]
    deletion = statements["AllowScopedDeletion"]
    assert sorted(deletion["Action"]) == ["ec2:DeleteLaunchTemplate", "ec2:TerminateInstances"]
    assert deletion["Condition"]["StringEquals"] == {f"aws:ResourceTag/{owned}": "owned"}
    passing = statements["AllowPassingInstanceRole"]
    assert "KarpenterNodeRole" in json.dumps(passing["Resource"])
    assert passing["Condition"] == {
        "StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]}
    }
    profile = statements["AllowScopedInstanceProfileCreationActions"]["Condition"]["StringEquals"]
    assert profile["aws:RequestTag/topology.kubernetes.io/region"] == {"Ref": "AWS::Region"}
    discovery = statements["AllowRegionalReadActions"]
    assert discovery["Condition"] == {"StringEquals": {"aws:RequestedRegion": {"Ref": "AWS::Region"}}}


MUTATING_PREFIXES = (
    "ec2:Run",
    "ec2:Create",
    "ec2:Terminate",
    "ec2:Delete",
    "iam:Create",
    "iam:Delete",
    "iam:Add",
    "iam:Remove",
    "iam:Tag",
    "iam:PassRole",
    "sqs:Delete",
)


def test_controller_policy_has_no_ec2_star_and_no_unconditioned_star_on_mutating_actions(
    cluster: SynthesizedTemplate,
) -> None:
    for sid, statement in controller_statements(cluster).items():
        actions = as_list(statement["Action"])
        assert not any(a in ("*", "ec2:*", "iam:*") for a in actions), sid
        if statement["Resource"] == "*" and any(a.startswith(MUTATING_PREFIXES) for a in actions):
            assert statement.get("Condition"), f"{sid}: a mutating action on * without a condition"


def test_node_role_has_the_four_upstream_managed_policies(cluster: SynthesizedTemplate) -> None:
    (role,) = [r for k, r in cluster.of_type("AWS::IAM::Role").items() if k.startswith("KarpenterNodeRole")]
    arns = json.dumps(role["Properties"]["ManagedPolicyArns"])
    for name in NODE_MANAGED_POLICIES:
        assert f"policy/{name}" in arns
    assert len(role["Properties"]["ManagedPolicyArns"]) == 4


def test_interruption_queue_keeps_messages_300_s_encrypted_and_tls_only(cluster: SynthesizedTemplate) -> None:
    (queue,) = cluster.of_type("AWS::SQS::Queue").values()
    assert queue["Properties"]["MessageRetentionPeriod"] == 300
    assert queue["Properties"]["SqsManagedSseEnabled"] is True
    (policy,) = cluster.of_type("AWS::SQS::QueuePolicy").values()
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert any(
        s["Effect"] == "Deny" and s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}} for s in statements
    )
    # Deliberate deviation from upstream: no blanket grant; each rule may send, by aws:SourceArn.
    senders = [s for s in statements if s["Effect"] == "Allow"]
    assert {svc for s in senders for svc in as_list(s["Principal"]["Service"])} == {"events.amazonaws.com"}
    assert len(senders) == 5 and all("aws:SourceArn" in s["Condition"]["ArnEquals"] for s in senders)


def test_the_five_upstream_event_patterns_target_the_queue(cluster: SynthesizedTemplate) -> None:
    (queue_id,) = cluster.of_type("AWS::SQS::Queue")
    rules = list(cluster.of_type("AWS::Events::Rule").values())
    patterns = sorted(
        (r["Properties"]["EventPattern"]["source"], r["Properties"]["EventPattern"]["detail-type"]) for r in rules
    )
    assert patterns == sorted(([source], [detail]) for _, source, detail in INTERRUPTION_RULES)
    assert sorted(d for _, _, d in INTERRUPTION_RULES) == [
        "AWS Health Event",
        "EC2 Capacity Reservation Instance Interruption Warning",
        "EC2 Instance Rebalance Recommendation",
        "EC2 Instance State-change Notification",
        "EC2 Spot Instance Interruption Warning",
    ]
    for rule in rules:
        assert rule["Properties"]["State"] == "ENABLED"
        (target,) = rule["Properties"]["Targets"]
        assert target["Arn"] == {"Fn::GetAtt": [queue_id, "Arn"]}


def test_crds_come_from_the_karpenter_crd_chart_installed_before_the_controller(cluster: SynthesizedTemplate) -> None:
    """Helm never upgrades a chart's crds/: the CRDs ride their own chart, and the controller skips them."""
    crd_id, crds = helm_chart(cluster, "karpenter-crd")
    controller_id, controller = helm_chart(cluster, "karpenter")
    assert crds["Properties"]["Repository"] == "oci://public.ecr.aws/karpenter/karpenter-crd"
    assert crds["Properties"]["Version"] == controller["Properties"]["Version"] == "1.14.1"
    assert controller["Properties"].get("SkipCrds") is True
    assert crd_id in depends_on(cluster, controller_id)


def test_node_classes_use_al2023_discovery_imdsv2_and_encrypted_roots(
    objects: dict[str, list[dict[str, Any]]], demo: Synthesized
) -> None:
    alias = demo.config.compute.node_ami_alias
    assert re.fullmatch(r"al2023@v\d{8}", alias), "a dated alias: @latest replaces nodes on every AMI release"
    for name, size in (("gpu", "200Gi"), ("cpu", "50Gi")):
        spec = one(objects, "EC2NodeClass", name)["spec"]
        assert spec["amiSelectorTerms"] == [{"alias": alias}]
        assert spec["subnetSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": "beacon-demo"}}]
        assert {"tags": {"karpenter.sh/discovery": "beacon-demo"}} in spec["securityGroupSelectorTerms"]
        assert spec["metadataOptions"]["httpTokens"] == "required"
        assert spec["metadataOptions"]["httpPutResponseHopLimit"] in (1, 2)
        (device,) = spec["blockDeviceMappings"]
        assert device["ebs"]["encrypted"] is True and device["ebs"]["volumeSize"] == size
        assert spec["tags"] == {"beacon:team": "demo", "beacon:component": f"karpenter-node-{name}"}
        assert "KarpenterNodeRole" in spec["role"]


def test_gpu_pool_is_tainted_limited_empty_only_and_disrupts_one_node_at_a_time(
    objects: dict[str, list[dict[str, Any]]], demo: Synthesized
) -> None:
    spec = one(objects, "NodePool", "gpu-training")["spec"]
    template = spec["template"]["spec"]
    assert template["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    requirements = {r["key"]: r["values"] for r in template["requirements"]}
    assert requirements["karpenter.k8s.aws/instance-family"] == list(demo.config.compute.gpu_instance_families)
    assert requirements["karpenter.sh/capacity-type"] == list(demo.config.compute.capacity_types)
    assert spec["limits"] == {
        "nvidia.com/gpu": str(demo.config.compute.gpu_limit),
        "cpu": str(demo.config.compute.gpu_cpu_limit),
    }
    assert spec["disruption"]["consolidationPolicy"] == "WhenEmpty"
    assert spec["disruption"]["budgets"] == [{"nodes": "1"}]
    assert template["terminationGracePeriod"] and template["expireAfter"]
    assert template["nodeClassRef"] == {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"}


def tolerates(tolerations: list[dict[str, str]], taint: dict[str, str]) -> bool:
    """Kubernetes' rule: a key that matches (or an empty key with Exists), Exists or an equal value, and the
    same effect or none."""
    return any(
        (t.get("key", "") in ("", taint["key"]) if t.get("operator") == "Exists" else t.get("key") == taint["key"])
        and (t.get("operator") == "Exists" or t.get("value") == taint.get("value"))
        and t.get("effect", "") in ("", taint["effect"])
        for t in tolerations
    )


def test_the_node_monitoring_agents_dcgm_host_engine_runs_on_the_tainted_gpu_nodes(
    cluster: SynthesizedTemplate, objects: dict[str, list[dict[str, Any]]]
) -> None:
    """The agent reads a GPU through the dcgm-server DaemonSet, which tolerates no taint by default: without it on
    the GPU pool's nodes the agent reports DCGMError (Fatal, AcceleratedHardwareReady=False), and node repair
    replaces every GPU node 10 minutes after it boots. The add-on's configuration lets it tolerate the pool's taint."""
    (addon,) = [
        a["Properties"]
        for a in cluster.of_type("AWS::EKS::Addon").values()
        if a["Properties"]["AddonName"] == "eks-node-monitoring-agent"
    ]
    configuration = json.loads(addon["ConfigurationValues"])
    assert set(configuration) == {"dcgmAgent"}, "only what must change; the agent's own tolerations are Exists"
    (taint,) = one(objects, "NodePool", "gpu-training")["spec"]["template"]["spec"]["taints"]
    assert tolerates(configuration["dcgmAgent"]["tolerations"], taint)
    assert not tolerates([], taint), "the chart's default (dcgmAgent.tolerations: []) would not"


# The DCGM host engines the add-ons can run, as their charts make them: (add-on, what it calls it, whether it runs
# at all given the add-on's configuration, the tolerations it gets). Issue 25, item 8.
def dcgm_host_engines(configurations: dict[str, dict[str, Any]]) -> list[tuple[str, str, bool, list[dict[str, str]]]]:
    monitoring = configurations.get("eks-node-monitoring-agent", {})
    observability = configurations.get("amazon-cloudwatch-observability", {})
    exporter = observability.get("dcgmExporter", {})
    return [
        # dcgm-server: the host engine the agent reads each GPU through; dcgmAgent.tolerations (chart default: none)
        ("eks-node-monitoring-agent", "dcgm-server", True, monitoring.get("dcgmAgent", {}).get("tolerations", [])),
        # dcgm-exporter: embeds its own host engine (no --remote-hostengine-info in its chart); on by default
        # (dcgmExporter.enabled), tolerating every taint (the chart's root tolerations)
        ("amazon-cloudwatch-observability", "dcgm-exporter", exporter.get("enabled", True),
         exporter.get("tolerations", [{"operator": "Exists"}])),
    ]  # fmt: skip


def test_at_most_one_dcgm_host_engine_can_run_on_a_gpu_node(
    cluster: SynthesizedTemplate, objects: dict[str, list[dict[str, Any]]]
) -> None:
    """Two host engines on one GPU node can mark it unhealthy (AcceleratedHardwareReady=False); with node repair on,
    Karpenter replaces the node 10 minutes later, and the 20 % guard rounds up: a one-node GPU pool is repaired
    mid-run. From the add-ons' configurations as synthesized: the agent's engine runs there, the exporter's does not."""
    configurations = {
        a["Properties"]["AddonName"]: json.loads(a["Properties"].get("ConfigurationValues", "{}"))
        for a in cluster.of_type("AWS::EKS::Addon").values()
    }
    (taint,) = one(objects, "NodePool", "gpu-training")["spec"]["template"]["spec"]["taints"]
    on_gpu_nodes = [name for _, name, runs, tolerations in dcgm_host_engines(configurations)
                    if runs and tolerates(tolerations, taint)]  # fmt: skip
    assert on_gpu_nodes == ["dcgm-server"], on_gpu_nodes
    defaults = {"eks-node-monitoring-agent": {"dcgmAgent": configurations["eks-node-monitoring-agent"]["dcgmAgent"]}}
    assert [n for _, n, runs, t in dcgm_host_engines(defaults) if runs and tolerates(t, taint)] == [
        "dcgm-server",
        "dcgm-exporter",
    ], "the observability add-on's default would be the second engine"


def test_cpu_smoke_pool_has_its_own_limits(objects: dict[str, list[dict[str, Any]]], demo: Synthesized) -> None:
    spec = one(objects, "NodePool", "cpu-smoke")["spec"]
    assert spec["limits"] == {"cpu": str(demo.config.compute.smoke_cpu_limit)}
    assert spec["template"]["spec"]["nodeClassRef"]["name"] == "cpu"


def test_karpenter_objects_validate_against_the_karpenter_schema(objects: dict[str, list[dict[str, Any]]]) -> None:
    karpenter = [o for o in all_objects(objects) if o["apiVersion"].startswith("karpenter")]
    assert {o["kind"] for o in karpenter} == {"EC2NodeClass", "NodePool"}
    done = subprocess.run(
        ["node", str(ROOT / "tests/validate_karpenter.mjs")],
        input=json.dumps(karpenter),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == 4 and all(r["error"] is None for r in results), results


def test_core_objects_validate_strictly_for_the_cluster_version(objects: dict[str, list[dict[str, Any]]]) -> None:
    core = [o for o in all_objects(objects) if not o["apiVersion"].startswith("karpenter")]
    assert {o["kind"] for o in core} >= {
        "Namespace",
        "ServiceAccount",
        "StorageClass",
        "PersistentVolume",
        "PersistentVolumeClaim",
        "Job",
    }
    for item in core:
        kubernetes_validate.validate(item, KUBERNETES, strict=True)


def depends_on(cluster: SynthesizedTemplate, logical_id: str) -> list[str]:
    return list(cluster.resources[logical_id].get("DependsOn", []))


def manifest_id(objects: dict[str, list[dict[str, Any]]], kind: str) -> str:
    return next(k for k, group in objects.items() if any(o["kind"] == kind for o in group))


def test_destroy_removes_node_pools_before_node_classes_chart_and_cluster(
    cluster: SynthesizedTemplate, objects: dict[str, list[dict[str, Any]]]
) -> None:
    pools, classes = manifest_id(objects, "NodePool"), manifest_id(objects, "EC2NodeClass")
    chart, _ = helm_chart(cluster, "karpenter")
    assert classes in depends_on(cluster, pools)
    assert chart in depends_on(cluster, classes)
    job = manifest_id(objects, "Job")
    assert pools in depends_on(cluster, job), "the smoke Job goes before the pools that run it"


def depends_transitively(cluster: SynthesizedTemplate, logical_id: str) -> set[str]:
    seen: set[str] = set()
    pending = depends_on(cluster, logical_id)
    while pending:
        current = pending.pop()
        if current not in seen:
            seen.add(current)
            pending += depends_on(cluster, current)
    return seen


def test_whatever_takes_credentials_by_pod_identity_starts_after_the_agent_that_serves_them(
    cluster: SynthesizedTemplate, objects: dict[str, list[dict[str, Any]]]
) -> None:
    """Karpenter, the EFS and observability add-ons and the smoke Job take their roles by Pod Identity; started before
    the agent serves credentials, a preflight fails (exit 3, final for the Job's podFailurePolicy); issue 25, item 9."""
    addons = {a["Properties"]["AddonName"]: k for k, a in cluster.of_type("AWS::EKS::Addon").items()}
    agent = addons["eks-pod-identity-agent"]
    chart, _ = helm_chart(cluster, "karpenter")
    for dependent in (chart, addons["aws-efs-csi-driver"], addons["amazon-cloudwatch-observability"],
                      manifest_id(objects, "Job")):  # fmt: skip
        assert agent in depends_transitively(cluster, dependent), dependent


# --- volume and the smoke Job ----------------------------------------------------------------
def test_efs_is_encrypted_backed_up_tiered_retained_and_reachable_only_from_training_nodes(demo: Synthesized) -> None:
    artifacts = demo.template("artifacts")
    (fs,) = artifacts.of_type("AWS::EFS::FileSystem").values()
    properties = fs["Properties"]
    assert properties["Encrypted"] is True and "KmsKeyId" in properties
    assert properties["BackupPolicy"] == {"Status": "ENABLED"}
    assert {"TransitionToIA": "AFTER_30_DAYS"} in properties["LifecyclePolicies"]
    assert fs["DeletionPolicy"] == "Retain"
    mounts = list(artifacts.of_type("AWS::EFS::MountTarget").values())
    assert len(mounts) == demo.config.network.az_count
    (ingress,) = artifacts.of_type("AWS::EC2::SecurityGroupIngress").values()
    assert (ingress["Properties"]["FromPort"], ingress["Properties"]["ToPort"]) == (2049, 2049)
    assert "TrainingNodes" in json.dumps(ingress["Properties"]["SourceSecurityGroupId"])


def test_access_point_owns_writes_as_the_training_uid_with_0750(demo: Synthesized) -> None:
    (point,) = demo.template("artifacts").of_type("AWS::EFS::AccessPoint").values()
    uid, gid = str(demo.config.training.uid), str(demo.config.training.gid)
    assert point["Properties"]["PosixUser"] == {"Uid": uid, "Gid": gid}
    assert point["Properties"]["RootDirectory"]["CreationInfo"] == {
        "OwnerUid": uid,
        "OwnerGid": gid,
        "Permissions": "750",
    }


def test_the_smoke_pods_security_context_equals_the_access_points_uid_and_gid(
    demo: Synthesized, objects: dict[str, list[dict[str, Any]]]
) -> None:
    (point,) = demo.template("artifacts").of_type("AWS::EFS::AccessPoint").values()
    posix = point["Properties"]["PosixUser"]
    context = one(objects, "Job")["spec"]["template"]["spec"]["securityContext"]
    assert (str(context["runAsUser"]), str(context["runAsGroup"]), str(context["fsGroup"])) == (
        posix["Uid"],
        posix["Gid"],
        posix["Gid"],
    )


def test_the_volume_is_a_static_pv_on_the_access_point_claimed_in_training(
    objects: dict[str, list[dict[str, Any]]],
) -> None:
    volume = one(objects, "PersistentVolume")
    assert volume["spec"]["csi"]["driver"] == "efs.csi.aws.com"
    assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    file_system, access_point = volume["spec"]["csi"]["volumeHandle"].split("::")
    assert "FileSystem" in file_system and "AccessPoint" in access_point
    claim = one(objects, "PersistentVolumeClaim")
    assert claim["metadata"]["namespace"] == "training"
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"]


def test_the_smoke_job_embodies_every_fix(objects: dict[str, list[dict[str, Any]]], demo: Synthesized) -> None:
    job = one(objects, "Job")
    assert job["metadata"]["namespace"] == "training"
    assert job["metadata"]["name"].startswith("beacon-smoke-")
    spec = job["spec"]
    pod = spec["template"]["spec"]
    assert spec["template"]["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert pod["serviceAccountName"] == "training"
    assert pod["restartPolicy"] == "Never"
    assert spec["podFailurePolicy"]["rules"][0] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget"}],
    }
    assert spec["backoffLimit"] >= 1 and spec["ttlSecondsAfterFinished"] > 0
    (train,) = pod["containers"]
    env = {e["name"]: e["value"] for e in train["env"] if "value" in e}
    assert pod["terminationGracePeriodSeconds"] > int(env["BEACON_SHUTDOWN_BUDGET"])
    assert env["BEACON_HEARTBEAT_INTERVAL"] == str(demo.config.monitoring.heartbeat_interval_seconds)
    assert env["BEACON_STEPS"] == str(demo.config.training.smoke_steps)
    liveness = train["livenessProbe"]
    assert "-lt 120" in " ".join(liveness["exec"]["command"])
    assert liveness["periodSeconds"] * liveness["failureThreshold"] <= 30 < 120
    assert train["resources"]["requests"] and train["resources"]["limits"]
    mounts = {m["mountPath"] for m in train["volumeMounts"]}
    assert manifests.ARTIFACTS_MOUNT in mounts
    assert env["BEACON_SPOOL_DIR"].startswith(manifests.ARTIFACTS_MOUNT)
    assert env["BEACON_CHECKPOINT_DIR"].startswith(manifests.ARTIFACTS_MOUNT)
    (check,) = pod["initContainers"]
    assert "not writable by uid" in " ".join(check["command"])
    assert "tolerations" not in pod, "the CPU smoke run needs no GPU toleration"


def test_the_image_is_built_from_the_runtime_and_its_smoke_job_as_a_cdk_asset(demo: Synthesized) -> None:
    manifest = json.loads((demo.outdir / "beacon-demo-cluster.assets.json").read_text())
    images = manifest.get("dockerImages", {})
    assert len(images) == 1
    (image,) = images.values()
    staged = demo.outdir / image["source"]["directory"]
    for needed in ("Dockerfile", "requirements.txt", "pyproject.toml", "beacon/telemetry.py", "smoke_job/train.py"):
        assert (staged / needed).is_file(), needed
    assert not list(staged.rglob("__pycache__")) and not list(staged.glob("*.egg-info"))


def test_the_operators_may_read_what_the_doctor_reads_beyond_the_namespace_and_nothing_more(
    demo_config: TeamConfig, tmp_path: Path
) -> None:
    """The doctor reads each node its pods ran on, the node's events in `default` and its Karpenter NodePool:
    EKS's namespace-scoped edit policy allows none, so the access entry carries a group that RBAC binds to exactly
    those reads.
    Evaluated as the API server's RBAC authorizer would: a rule allows (verb, group, resource, namespace)."""
    operator = "arn:aws:iam::123456789012:role/ml-vision-operators"
    config = demo_config.model_copy(
        update={"cluster": demo_config.cluster.model_copy(update={"operator_role_arns": (operator,)})}
    )
    cluster = synthesize(config, tmp_path).template("cluster")
    (entry,) = [
        e["Properties"]
        for e in cluster.of_type("AWS::EKS::AccessEntry").values()
        if e["Properties"]["PrincipalArn"] == operator
    ]
    groups = set(entry["KubernetesGroups"])
    found = all_objects(kubernetes_objects(cluster))
    roles = {
        (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")): o
        for o in found
        if o["kind"] in ("Role", "ClusterRole")
    }
    bound: list[tuple[dict[str, Any], str | None]] = []  # (role, the namespace it applies in; None: all)
    for binding in [o for o in found if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]:
        if {s["name"] for s in binding["subjects"] if s["kind"] == "Group"} & groups:
            where = binding["metadata"].get("namespace")
            bound.append(
                (
                    roles[
                        (
                            binding["roleRef"]["kind"],
                            binding["roleRef"]["name"],
                            where if binding["roleRef"]["kind"] == "Role" else None,
                        )
                    ],
                    where,
                )
            )

    def allowed(verb: str, resource: str, namespace: str | None, group: str = "") -> bool:
        return any(
            verb in rule["verbs"] and resource in rule["resources"] and group in rule["apiGroups"]
            for role, where in bound
            if where is None or where == namespace
            for rule in role["rules"]
        )

    assert allowed("get", "nodes", None) and allowed("list", "events", NODE_EVENTS_NAMESPACE)
    assert not allowed("list", "events", "kube-system"), "node events only, where Kubernetes records them"
    for verb, resource, namespace in (("list", "secrets", None), ("patch", "nodes", None), ("delete", "nodes", None)):
        assert not allowed(verb, resource, namespace), (verb, resource)
    assert allowed("get", "nodepools", None, "karpenter.sh"), "a node's NodePool: its expireAfter"
    for verb, resource in (("patch", "nodepools"), ("delete", "nodepools"), ("list", "nodeclaims"), ("get", "pods")):
        assert not allowed(verb, resource, None, "karpenter.sh"), (verb, resource)


# --- issue 25, item 10: the add-on's Container Insights log groups, held to the team's retention ----------------
def sdk_calls(cluster: SynthesizedTemplate, event: str) -> list[dict[str, Any]]:
    """Each Custom::AWS resource's call for `event` (Create, Update), as CDK's SDK-call function reads it."""
    return [
        json.loads(r["Properties"][event]) for r in cluster.of_type("Custom::AWS").values() if event in r["Properties"]
    ]


def run_as_the_provider(logs: Any, call: dict[str, Any]) -> None:
    """What CDK's SDK-call function does with one call: the SDK action, and an error whose code matches
    `ignoreErrorCodesMatching` counts as success."""
    action = re.sub(r"(?<!^)(?=[A-Z])", "_", call["action"]).lower()
    try:
        getattr(logs, action)(**call["parameters"])
    except logs.exceptions.ClientError as error:
        if not re.search(call.get("ignoreErrorCodesMatching", "^$"), error.response["Error"]["Code"]):
            raise


def test_every_container_insights_group_is_created_or_adopted_then_held_to_the_teams_retention(
    cluster: SynthesizedTemplate, demo: Synthesized
) -> None:
    groups = names.container_insights_log_groups(names.cluster_name("demo"))
    for event in ("Create", "Update"):
        calls = sdk_calls(cluster, event)
        made = [c["parameters"]["logGroupName"] for c in calls if c["action"] == "createLogGroup"]
        kept = {c["parameters"]["logGroupName"]: c["parameters"]["retentionInDays"]
                for c in calls if c["action"] == "putRetentionPolicy"}  # fmt: skip
        assert sorted(made) == sorted(groups), event
        assert kept == dict.fromkeys(groups, demo.config.monitoring.log_retention_days), event
        assert all(c["ignoreErrorCodesMatching"] == "ResourceAlreadyExistsException"
                   for c in calls if c["action"] == "createLogGroup")  # fmt: skip
    addons = {a["Properties"]["AddonName"]: k for k, a in cluster.of_type("AWS::EKS::Addon").items()}
    held = set(cluster.of_type("Custom::AWS"))
    assert held <= depends_transitively(cluster, addons["amazon-cloudwatch-observability"]), "before it first writes"


@pytest.mark.parametrize("stack", ["new", "deployed-before"])
def test_the_upgrade_path_a_group_the_add_on_already_made_is_adopted_and_a_new_one_made(
    cluster: SynthesizedTemplate, demo: Synthesized, moto_server: MotoServer, stack: str
) -> None:
    """On a stack deployed before, the add-on made these groups with no retention: an AWS::Logs::LogGroup of the same
    name would fail the update (AlreadyExists). The calls, run against the embedded AWS as CDK's function runs them,
    adopt it there and make it on a new stack; the retention is the team's either way."""
    logs = moto_server.client("logs")
    groups = names.container_insights_log_groups(names.cluster_name("demo"))
    if stack == "deployed-before":
        for group in groups:
            logs.create_log_group(logGroupName=group)  # the add-on's own, kept forever
        with pytest.raises(logs.exceptions.ResourceAlreadyExistsException):
            logs.create_log_group(logGroupName=groups[0])  # what a CloudFormation log group of that name would meet
    # New resources on either stack: CloudFormation sends Create (an update of a later deploy sends the same calls)
    for call in sorted(sdk_calls(cluster, "Create"), key=lambda c: c["action"] != "createLogGroup"):
        run_as_the_provider(logs, call)
    described = {g["logGroupName"]: g.get("retentionInDays") for g in logs.describe_log_groups()["logGroups"]}
    assert {g: described.get(g) for g in groups} == dict.fromkeys(groups, demo.config.monitoring.log_retention_days)
