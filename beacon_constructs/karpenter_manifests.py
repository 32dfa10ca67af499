"""Karpenter 1.x (API v1) objects as plain dicts: the node classes and the two node pools."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workloads.manifests import CPU_POOL, GPU_POOL, GPU_TAINT, POOL_LABEL

NODE_CLASS_API = "karpenter.k8s.aws/v1"
NODE_POOL_API = "karpenter.sh/v1"
DISCOVERY_TAG = "karpenter.sh/discovery"
GPU_NODE_CLASS, CPU_NODE_CLASS = "gpu", "cpu"


@dataclass(frozen=True)
class NodeClassSpec:
    name: str
    cluster_name: str
    node_role: str
    root_volume_gib: int
    team: str
    # A dated AL2023 alias; for GPU instance types Karpenter picks the NVIDIA variant of that release.
    ami_alias: str


def node_class(spec: NodeClassSpec) -> dict[str, Any]:
    discovery = {"tags": {DISCOVERY_TAG: spec.cluster_name}}
    return {
        "apiVersion": NODE_CLASS_API,
        "kind": "EC2NodeClass",
        "metadata": {"name": spec.name},
        "spec": {
            "role": spec.node_role,
            "amiSelectorTerms": [{"alias": spec.ami_alias}],
            "subnetSelectorTerms": [discovery],
            "securityGroupSelectorTerms": [discovery, {"tags": {"aws:eks:cluster-name": spec.cluster_name}}],
            # IMDSv2 only, hop limit 1: pods get credentials from Pod Identity, never from the node.
            "metadataOptions": {
                "httpEndpoint": "enabled",
                "httpProtocolIPv6": "disabled",
                "httpPutResponseHopLimit": 1,
                "httpTokens": "required",
            },
            "blockDeviceMappings": [
                {
                    "deviceName": "/dev/xvda",
                    "ebs": {
                        "volumeSize": f"{spec.root_volume_gib}Gi",
                        "volumeType": "gp3",
                        "encrypted": True,
                        "deleteOnTermination": True,
                    },
                }
            ],
            "tags": {"beacon:team": spec.team, "beacon:component": f"karpenter-node-{spec.name}"},
        },
    }


def _requirement(key: str, values: list[str], operator: str = "In") -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": values}


def _node_pool(
    name: str,
    *,
    node_class_name: str,
    requirements: list[dict[str, Any]],
    expire_after: str,
    termination_grace: str,
    disruption: dict[str, Any],
    limits: dict[str, str],
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    template: dict[str, Any] = {
        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": node_class_name},
        "requirements": [
            *requirements,
            _requirement("kubernetes.io/arch", ["amd64"]),
            _requirement("kubernetes.io/os", ["linux"]),
        ],
        "expireAfter": expire_after,
        # Caps how long do-not-disrupt can hold an expired node: expiry never sticks.
        "terminationGracePeriod": termination_grace,
    }
    if taints:
        template["taints"] = taints
    return {
        "apiVersion": NODE_POOL_API,
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "template": {"metadata": {"labels": {POOL_LABEL: name}}, "spec": template},
            "disruption": {**disruption, "budgets": [{"nodes": "1"}]},  # never more than one node at a time
            "limits": limits,  # the cost guard
        },
    }


def gpu_training_pool(
    *,
    instance_families: list[str],
    instance_types: list[str],
    capacity_types: list[str],
    gpu_limit: int,
    cpu_limit: int,
) -> dict[str, Any]:
    requirements = [
        _requirement("karpenter.k8s.aws/instance-family", instance_families),
        _requirement("karpenter.sh/capacity-type", capacity_types),
    ]
    if instance_types:
        requirements.append(_requirement("node.kubernetes.io/instance-type", instance_types))
    return _node_pool(
        GPU_POOL,
        node_class_name=GPU_NODE_CLASS,
        requirements=requirements,
        taints=[GPU_TAINT],
        expire_after="720h",
        termination_grace="24h",
        # Only empty nodes go: consolidation, not Spot, is what evicts training pods.
        disruption={"consolidationPolicy": "WhenEmpty", "consolidateAfter": "10m"},
        limits={"nvidia.com/gpu": str(gpu_limit), "cpu": str(cpu_limit)},
    )


def cpu_smoke_pool(*, capacity_types: list[str], cpu_limit: int) -> dict[str, Any]:
    return _node_pool(
        CPU_POOL,
        node_class_name=CPU_NODE_CLASS,
        requirements=[
            _requirement("karpenter.k8s.aws/instance-category", ["c", "m"]),
            _requirement("karpenter.k8s.aws/instance-cpu", ["17"], operator="Lt"),
            _requirement("karpenter.k8s.aws/instance-generation", ["5"], operator="Gt"),
            _requirement("karpenter.sh/capacity-type", capacity_types),
        ],
        expire_after="168h",
        termination_grace="2h",
        disruption={"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "2m"},
        limits={"cpu": str(cpu_limit)},
    )


def pool_node_labels(pool: dict[str, Any]) -> dict[str, str]:
    """The labels every node the pool creates carries (besides Karpenter's own)."""
    return dict(pool["spec"]["template"]["metadata"]["labels"])


def pool_node_taints(pool: dict[str, Any]) -> list[dict[str, str]]:
    return list(pool["spec"]["template"]["spec"].get("taints", []))
