"""The NVIDIA device plugin: what makes a GPU node advertise `nvidia.com/gpu` to the scheduler.

The EKS AL2023 NVIDIA AMI ships the driver but not the device plugin; without it GPU pods stay
Pending on nodes Karpenter already bills for.
"""

from __future__ import annotations

from typing import Any, cast

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from beacon_constructs.tagging import tag_component

CHART = "nvidia-device-plugin"
CHART_REPOSITORY = "https://nvidia.github.io/k8s-device-plugin"
CHART_VERSION = "0.17.4"
NAMESPACE = "kube-system"


def toleration_for(taint: dict[str, str]) -> dict[str, str]:
    """Tolerates the taint whatever its value."""
    return {"key": taint["key"], "operator": "Exists", "effect": taint["effect"]}


class NvidiaDevicePlugin(Construct):
    """The device plugin DaemonSet on the GPU pool's nodes only, tolerating that pool's taints."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        node_labels: dict[str, str],
        node_taints: list[dict[str, str]],
    ) -> None:
        super().__init__(scope, construct_id)
        tag_component(self, "gpu-device-plugin")
        self.node_labels = dict(node_labels)
        self.tolerations = [toleration_for(t) for t in node_taints]
        # The chart's default affinity wants node-feature-discovery labels, which nothing here sets:
        # replaced (lists are not merged) by the GPU pool's own labels.
        affinity: dict[str, Any] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": key, "operator": "In", "values": [value]}
                                for key, value in sorted(self.node_labels.items())
                            ]
                        }
                    ]
                }
            }
        }
        self.chart = eks.HelmChart(
            self,
            "Chart",
            cluster=cast(eks.ICluster, cluster),  # jsii's protocol lags the class
            chart=CHART,
            repository=CHART_REPOSITORY,
            version=CHART_VERSION,
            namespace=NAMESPACE,
            release="nvidia-device-plugin",
            wait=False,  # a helm wait can outlive the 15-minute handler (aws-cdk 22257)
            values={"affinity": affinity, "tolerations": self.tolerations},
        )
