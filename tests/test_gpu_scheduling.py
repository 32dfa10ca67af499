"""A GPU NodePool is useful only if something advertises `nvidia.com/gpu` on the nodes it creates.

The EKS AL2023 NVIDIA AMI has the driver, not the device plugin; Bottlerocket's NVIDIA variant has
both. So for every GPU pool: its node class's AMI family decides what must advertise the GPUs, and a
device-plugin DaemonSet must tolerate the pool's taints and select the pool's nodes (issue 11, item 2).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from beacon_ops.templates import Template as SynthesizedTemplate
from beacon_ops.templates import kubernetes_objects, shape_resolver
from tests.support.synth import Synthesized

GPU_RESOURCE = "nvidia.com/gpu"
DEVICE_PLUGIN_CHART = "nvidia-device-plugin"
# What advertises nvidia.com/gpu, by AMI family (EKS user guide, "NVIDIA device plugin for Kubernetes").
ADVERTISER_BY_AMI_FAMILY = {"al2023": "chart", "bottlerocket": "built in"}


@pytest.fixture(scope="module")
def cluster(demo: Synthesized) -> SynthesizedTemplate:
    return demo.template("cluster")


@pytest.fixture(scope="module")
def objects(cluster: SynthesizedTemplate) -> list[dict[str, Any]]:
    return [o for group in kubernetes_objects(cluster).values() for o in group]


def charts(cluster: SynthesizedTemplate, name: str) -> dict[str, dict[str, Any]]:
    found = cluster.of_type("Custom::AWSCDK-EKS-HelmChart")
    return {k: c for k, c in found.items() if c["Properties"]["Chart"] == name}


def chart_values(chart: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = json.loads(shape_resolver().resolve(chart["Properties"].get("Values", "{}")))
    return values


def gpu_pools(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def is_gpu(pool: dict[str, Any]) -> bool:
        spec = pool["spec"]
        taints = spec["template"]["spec"].get("taints", [])
        return GPU_RESOURCE in spec.get("limits", {}) or any(t["key"] == GPU_RESOURCE for t in taints)

    return [o for o in objects if o["kind"] == "NodePool" and is_gpu(o)]


def node_labels(pool: dict[str, Any]) -> dict[str, str]:
    """The labels every node of the pool carries for sure: the template's and Karpenter's pool label."""
    return {**pool["spec"]["template"]["metadata"].get("labels", {}), "karpenter.sh/nodepool": pool["metadata"]["name"]}


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, str]) -> bool:
    """Kubernetes' matching: effect empty or equal; Exists matches the key (or every key if empty)."""
    for toleration in tolerations:
        if toleration.get("effect") not in (None, "", taint["effect"]):
            continue
        if toleration.get("operator", "Equal") == "Exists":
            if toleration.get("key") in (None, "", taint["key"]):
                return True
        elif toleration.get("key") == taint["key"] and toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def _expression_holds(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {operator} cannot be decided from labels alone")


def selects(values: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a pod with the chart's nodeSelector and required node affinity may land on such a node."""
    if any(labels.get(k) != v for k, v in values.get("nodeSelector", {}).items()):
        return False
    required = values.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    return any(
        all(_expression_holds(e, labels) for e in term.get("matchExpressions", []))
        for term in required["nodeSelectorTerms"]
    )


def test_the_demo_has_a_gpu_pool(objects: list[dict[str, Any]]) -> None:
    assert [p["metadata"]["name"] for p in gpu_pools(objects)] == ["gpu-training"]


def test_every_gpu_pool_has_something_that_advertises_nvidia_gpu_on_its_nodes(
    cluster: SynthesizedTemplate, objects: list[dict[str, Any]]
) -> None:
    classes = {o["metadata"]["name"]: o for o in objects if o["kind"] == "EC2NodeClass"}
    plugins = charts(cluster, DEVICE_PLUGIN_CHART)
    for pool in gpu_pools(objects):
        name = pool["metadata"]["name"]
        node_class = classes[pool["spec"]["template"]["spec"]["nodeClassRef"]["name"]]
        (term,) = node_class["spec"]["amiSelectorTerms"]
        family = term["alias"].split("@")[0]
        assert family in ADVERTISER_BY_AMI_FAMILY, f"{name}: no known GPU advertiser for AMI family {family}"
        if ADVERTISER_BY_AMI_FAMILY[family] == "built in":
            continue
        assert len(plugins) == 1, f"{name}: AL2023 NVIDIA nodes need the {DEVICE_PLUGIN_CHART} chart"
        (plugin,) = plugins.values()
        assert re.fullmatch(r"\d+\.\d+\.\d+", plugin["Properties"].get("Version", "")), "the chart is pinned"
        values = chart_values(plugin)
        for taint in pool["spec"]["template"]["spec"].get("taints", []):
            assert tolerates(values.get("tolerations", []), taint), f"{name}: the plugin does not tolerate {taint}"
        assert selects(values, node_labels(pool)), f"{name}: the plugin's affinity does not select the pool's nodes"


def test_the_device_plugin_runs_on_gpu_nodes_only(cluster: SynthesizedTemplate, objects: list[dict[str, Any]]) -> None:
    (plugin,) = charts(cluster, DEVICE_PLUGIN_CHART).values()
    values = chart_values(plugin)
    cpu_pools = [o for o in objects if o["kind"] == "NodePool" and o not in gpu_pools(objects)]
    assert cpu_pools
    for pool in cpu_pools:
        assert not selects(values, node_labels(pool)), pool["metadata"]["name"]
    assert not selects(values, {}), "not on the system node group"


def test_the_device_plugin_comes_after_karpenter_and_before_the_node_pools(
    cluster: SynthesizedTemplate, objects: list[dict[str, Any]]
) -> None:
    """Deploy: Karpenter, plugin, pools. Destroy runs backwards: pools (and their nodes) go first."""
    (plugin_id,) = charts(cluster, DEVICE_PLUGIN_CHART)
    (karpenter_id,) = charts(cluster, "karpenter")
    assert karpenter_id in cluster.resources[plugin_id].get("DependsOn", [])
    pools_id = next(
        k for k, group in kubernetes_objects(cluster).items() if any(o["kind"] == "NodePool" for o in group)
    )
    assert plugin_id in cluster.resources[pools_id].get("DependsOn", [])
