"""Issue 25, item 7: a pod of the training namespace never lands on a system node.

The system node group keeps EKS's instance-metadata defaults (hop limit 2): a pod there reads the node's role (CNI
rights on `*`). Karpenter's nodes answer no pod (hop limit 1). So the namespace admits only pods that select a Beacon
pool and leave their node to the scheduler (a ValidatingAdmissionPolicy, its CEL evaluated here as the API server
would, with cel-python), and Pod Security Admission's baseline refuses the host's network, where the hop limit
does not apply. Every pod Beacon creates there passes both; an operator's `kubectl run` debug pod does not.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import celpy
import kubernetes_validate
import pytest
from beacon import contract
from celpy.adapter import json_to_cel

from workloads import manifests

BASE = manifests.SmokeJobSpec(team="demo", image="i.dkr.ecr.us-east-1.amazonaws.com/r:t", bucket="b",
                              region="us-east-1", uid=1000, gid=1000)  # fmt: skip


def admitted(pod: dict[str, Any]) -> list[str]:
    """The policy's messages for `pod` (empty: admitted), each validation evaluated as the API server does."""
    (policy, _) = manifests.pool_admission_policy()
    environment = celpy.Environment()
    refusals = []
    for validation in policy["spec"]["validations"]:
        program = environment.program(environment.compile(validation["expression"]))
        if not bool(program.evaluate({"object": json_to_cel(pod)})):
            refusals.append(validation["message"])
    return refusals


def pods_beacon_creates() -> list[dict[str, Any]]:
    """The pod of every Job variant Beacon runs in the namespace (smoke, a team's job, CPU and GPU, 1 and 2 nodes)."""
    pods = []
    for nodes in (1, 2):
        for gpu in (False, True):
            spec = dataclasses.replace(BASE, nodes=nodes, gpu=gpu, processes_per_node=2)
            for job in (o for o in manifests.smoke_job(spec) if o["kind"] == "Job"):
                pods.append({"apiVersion": "v1", "kind": "Pod", **job["spec"]["template"]})
    return pods


def debug_pod(**spec: Any) -> dict[str, Any]:
    """What `kubectl run debug -n training --image=busybox -- sleep 1d` creates, with `spec` on top."""
    container = {"name": "debug", "image": "busybox", "args": ["sleep", "1d"]}
    metadata = {"name": "debug", "namespace": contract.TRAINING_NAMESPACE}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": [container], **spec}}


def test_the_policy_and_its_binding_are_valid_kubernetes_1_35_and_match_pods_of_the_namespace_alone() -> None:
    policy, binding = manifests.pool_admission_policy()
    for item in (policy, binding):
        kubernetes_validate.validate(item, "1.35.0", strict=True)
    constraints = policy["spec"]["matchConstraints"]
    assert constraints["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "training"}}
    assert constraints["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    ]
    assert policy["spec"]["failurePolicy"] == "Fail" and binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]


def test_every_pod_beacon_creates_in_the_namespace_is_admitted() -> None:
    pods = pods_beacon_creates()
    assert len(pods) == 4
    for pod in pods:
        assert admitted(pod) == [], pod["spec"].get("nodeSelector")


@pytest.mark.parametrize(
    ("spec", "refused_for"),
    [
        ({}, "set nodeSelector beacon/pool"),  # `kubectl run`: no selector, the scheduler may pick a system node
        ({"nodeSelector": {"kubernetes.io/os": "linux"}}, "set nodeSelector beacon/pool"),
        ({"nodeSelector": {manifests.POOL_LABEL: "system"}}, "set nodeSelector beacon/pool"),
        ({"nodeSelector": {manifests.POOL_LABEL: manifests.CPU_POOL}, "nodeName": "ip-10-0-1-5"}, "spec.nodeName"),
    ],
)
def test_a_pod_that_could_land_on_a_system_node_is_refused_with_a_message_that_says_what_to_set(
    spec: dict[str, Any], refused_for: str
) -> None:
    (message,) = admitted(debug_pod(**spec))
    assert refused_for in message and "training" in message, message


# Pod Security Standards, baseline (kubernetes.io/docs/concepts/security/pod-security-standards): what reaches the
# host, and so the node's metadata whatever its hop limit. The namespace enforces it; Beacon's pods must pass.
BASELINE_CAPABILITIES = {
    *("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE"),
    *("SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"),
}


def baseline_violations(pod: dict[str, Any]) -> list[str]:
    spec = pod["spec"]
    found = [f"host namespace {k}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    found += [f"hostPath volume {v['name']}" for v in spec.get("volumes", []) if "hostPath" in v]
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        context = container.get("securityContext", {})
        if context.get("privileged"):
            found.append(f"{container['name']}: privileged")
        added = set(context.get("capabilities", {}).get("add", [])) - BASELINE_CAPABILITIES
        found += [f"{container['name']}: capability {c}" for c in sorted(added)]
        found += [f"{container['name']}: hostPort" for p in container.get("ports", []) if p.get("hostPort")]
    return found


def test_the_namespace_enforces_pod_security_baseline_and_beacons_pods_pass_it() -> None:
    labels = manifests.namespace()["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    for pod in pods_beacon_creates():
        assert baseline_violations(pod) == []
    assert baseline_violations(debug_pod(hostNetwork=True)) == ["host namespace hostNetwork"]
