"""The orchestrator's state of one Kubernetes Job, read through the Kubernetes API (read-only).

Reads: the Job; its pods (label `batch.kubernetes.io/job-name`); the events of its namespace that concern
the Job or its pods, gone pods included; its nodes (capacity type, NodePool, the conditions node repair acts
on) and the events on them, which Kubernetes records in the `default` namespace (Karpenter's interruption and
disruption events among them); and the NodePools of those nodes (their expireAfter).
Responses are taken as JSON, not as the client's models, so a field the client does not know never fails a
reading. Whatever cannot be read beside the Job becomes a note; a Job that cannot be read, a `problem`
with the fix. Never raises for an API or network failure.

Not imported by the diagnosis: the alarm's Lambda has no kubernetes client.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from beacon_ops.doctor.orchestrator import NODE_POOL_LABEL, OrchestratorState, job_state, nodes_of

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
NODE_EVENTS_NAMESPACE = "default"  # where the kubelet, the node controller and Karpenter record a Node's events
# kube-apiserver's --event-ttl, Kubernetes' default, which EKS keeps: an event older than this is gone.
EVENT_TTL = timedelta(hours=1)
NODE_POOLS = ("karpenter.sh", "v1", "nodepools")  # group, version, plural: cluster-scoped


def _json(response: Any) -> dict[str, Any]:
    return dict(json.loads(response.data))


def refused(error: ApiException, what: str, cluster: str) -> tuple[str, str]:
    """The problem and the fix for an API error."""
    if error.status in (401, 403):
        return (
            f"the Kubernetes API of {cluster} refused {what} ({error.status} {error.reason})",
            "list your role in cluster.operator_role_arns of the team file and redeploy: its access entry may edit "
            "the training namespace and, by the group beacon:doctor-readers, read nodes, their events and NodePools; "
            "a Job in another namespace needs a view role there",
        )
    return f"{what} on cluster {cluster}: {error.status} {error.reason}", ""


def unreachable(error: Exception, host: str, cluster: str) -> tuple[str, str]:
    return (
        f"cannot reach the Kubernetes API of {cluster} at {host} ({type(error).__name__})",
        "the endpoint is private: run the doctor inside the VPC, or pass --kubernetes-url through a tunnel "
        "(aws ssm start-session ... AWS-StartPortForwardingSessionToRemoteHost)",
    )


def read_job(api: k8s.ApiClient, *, cluster: str, namespace: str, name: str) -> OrchestratorState:
    """The Job `namespace/name`, its pods, events and nodes; or why they could not be read."""
    batch, core = k8s.BatchV1Api(api), k8s.CoreV1Api(api)
    base = OrchestratorState("eks", cluster, namespace, name, datetime.now(UTC))
    try:
        job = _json(batch.read_namespaced_job(name, namespace, _preload_content=False))
    except ApiException as error:
        if error.status == 404:
            return base
        problem, fix = refused(error, f"reading Job {namespace}/{name}", cluster)
        return replace(base, problem=problem, fix=fix)
    except urllib3.exceptions.HTTPError as error:
        problem, fix = unreachable(error, str(api.configuration.host), cluster)
        return replace(base, problem=problem, fix=fix)
    notes: list[str] = []

    def listed(what: str, read: Any) -> list[dict[str, Any]]:
        try:
            return list(_json(read()).get("items") or [])
        except ApiException as error:
            notes.append(refused(error, what, cluster)[0])
        except urllib3.exceptions.HTTPError as error:
            notes.append(unreachable(error, str(api.configuration.host), cluster)[0])
        return []

    pods = listed(
        f"listing the pods of Job {namespace}/{name}",
        lambda: core.list_namespaced_pod(namespace, label_selector=f"{JOB_NAME_LABEL}={name}", _preload_content=False),
    )
    events = listed(
        f"listing the events of namespace {namespace}",
        lambda: core.list_namespaced_event(namespace, _preload_content=False),
    )
    # The nodes: those the pods are on, and those the scheduler's events name for pods that are gone.
    partial = job_state(job, pods, events)
    nodes: dict[str, dict[str, Any] | None] = {}
    for node in nodes_of(list(partial.pods), list(partial.events)):
        try:
            nodes[node] = _json(core.read_node(node, _preload_content=False))
        except ApiException as error:
            nodes[node] = None
            if error.status != 404:  # a node that is gone is a fact, not a failure
                notes.append(refused(error, f"reading node {node}", cluster)[0])
        except urllib3.exceptions.HTTPError as error:
            nodes[node] = None
            notes.append(unreachable(error, str(api.configuration.host), cluster)[0])
        events += listed(
            f"listing the events of node {node}",
            lambda node=node: core.list_namespaced_event(
                NODE_EVENTS_NAMESPACE,
                field_selector=f"involvedObject.kind=Node,involvedObject.name={node}",
                _preload_content=False,
            ),
        )
    pools: dict[str, dict[str, Any]] = {}
    custom = k8s.CustomObjectsApi(api)
    for pool in sorted({str(named) for n in nodes.values() if (named := _labels(n).get(NODE_POOL_LABEL))}):
        try:
            pools[pool] = _json(custom.get_cluster_custom_object(*NODE_POOLS, pool, _preload_content=False))
        except ApiException as error:
            if error.status != 404:  # a NodePool deleted since, or no Karpenter: nothing to read
                notes.append(refused(error, f"reading NodePool {pool}", cluster)[0])
        except urllib3.exceptions.HTTPError as error:
            notes.append(unreachable(error, str(api.configuration.host), cluster)[0])
    state = job_state(job, pods, events, nodes, pools)
    if state.created_at is not None and base.read_at - state.created_at > EVENT_TTL:
        notes.append(
            f"Kubernetes keeps events for {EVENT_TTL.total_seconds() / 3600:g} h: what happened to this Job's pods "
            f"and nodes before {base.read_at - EVENT_TTL:%Y-%m-%d %H:%M} UTC (a Spot interruption, an eviction, the "
            "node a gone pod ran on) can no longer be read; the logs check still reads its containers' logs, and "
            "Karpenter's own log (kube-system, in Container Insights) names the nodes it interrupted or removed"
        )
    return replace(base, job=state, notes=tuple(dict.fromkeys(notes)))


def _labels(node: dict[str, Any] | None) -> dict[str, Any]:
    return dict(((node or {}).get("metadata") or {}).get("labels") or {})
