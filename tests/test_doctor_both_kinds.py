"""Issue 16's "done when": for each failure, `beacon doctor` names the cause in its first line with quoted
evidence, on a Beacon job (`--run`: its evidence is read too) and on a foreign one (`--job`: the orchestrator
and the logs alone). The same cluster state for both kinds; only the Job differs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.support.deployed_team import DeployedTeam
from tests.support.fake_kubernetes import FakeKubernetes
from tests.test_doctor_logs import CLUSTER_LOGS, DENIED, FAILED, REFUSED, fluent_bit, put_lines, stream_of
from tests.test_doctor_orchestrator import (
    GPU_NODE,
    SPOT_MESSAGE,
    T0,
    XID_MESSAGE,
    XID_REASON,
    answered,
    beacon_job,
    event,
    force_deleted,
    foreign_job,
    grace_expiring,
    karpenter_node,
    node_pool,
    pod,
    unschedulable,
    xid_condition,
)

Seed = Callable[[DeployedTeam, FakeKubernetes, dict[str, Any]], None]


def oom(_: DeployedTeam, kubernetes: FakeKubernetes, job: dict[str, Any]) -> None:
    killed = {"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": T0, "finishedAt": T0}}
    kubernetes.seed(job=job, pods=[pod(job, "0-a1s2d", phase="Failed", state=killed, memory="8Gi")])


def spot(_: DeployedTeam, kubernetes: FakeKubernetes, job: dict[str, Any]) -> None:
    """The interrupted pod is gone; the scheduler's event ties its node to the job."""
    gone = f"{job['metadata']['name']}-0-aaaaa"
    placed = f"Successfully assigned training/{gone} to {GPU_NODE}"
    events = [
        event("Pod", gone, "Scheduled", placed, T0, source="default-scheduler", kind_type="Normal"),
        event("Node", GPU_NODE, "SpotInterrupted", SPOT_MESSAGE, "2026-12-01T10:05:00Z", source="karpenter"),
    ]
    kubernetes.seed(job=job, pods=[unschedulable(job, "0-bbbbb", "0/2 nodes are available")], events=events)


def no_gpus(_: DeployedTeam, kubernetes: FakeKubernetes, job: dict[str, Any]) -> None:
    kubernetes.seed(
        job=job, pods=[unschedulable(job, "0-c3v4b", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")]
    )


def image_pull(_: DeployedTeam, kubernetes: FakeKubernetes, job: dict[str, Any]) -> None:
    back_off = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x"'}}
    kubernetes.seed(job=job, pods=[pod(job, "0-d5f6g", phase="Pending", state=back_off)])


def evicted_from(
    kubernetes: FakeKubernetes, job: dict[str, Any], node: dict[str, Any], *, deleted: str, by: str, **seeded: Any
) -> None:
    """Karpenter deleted `node`'s NodeClaim at `deleted`: as on Beacon's pools (terminationGracePeriod set), the
    Node gets "All pods will be deleted by `by`" and the job's pod is deleted then ("Disrupted"). It is gone;
    its retry waits for a node."""
    gone, node_name = f"{job['metadata']['name']}-0-hhhhh", node["metadata"]["name"]
    events = [
        event("Pod", gone, "Scheduled", f"Successfully assigned training/{gone} to {node_name}", T0,
              source="default-scheduler", kind_type="Normal"),
        grace_expiring(node_name, by, deleted),
        force_deleted(gone, by, by),
    ]  # fmt: skip
    retry = unschedulable(job, "0-jjjjj", "0/2 nodes are available")
    kubernetes.seed(job=job, pods=[retry], events=events, nodes=[node], **seeded)


def node_repair(_: DeployedTeam, kubernetes: FakeKubernetes, job: dict[str, Any]) -> None:
    """The GPU fell off the bus at 10:02; ten minutes on, node repair deleted its NodeClaim with a termination time
    of now, so the pod was deleted at once."""
    xid = xid_condition("2026-12-01T10:02:00Z")
    sick = karpenter_node(f"{job['metadata']['name']}.node", created="2026-12-01T09:00:00Z",
                          deleting="2026-12-01T10:12:30Z", conditions=[xid])  # fmt: skip
    evicted_from(kubernetes, job, sick, deleted="2026-12-01T10:12:30Z", by="2026-12-01T10:12:30Z")


def expiry(_: DeployedTeam, kubernetes: FakeKubernetes, job: dict[str, Any]) -> None:
    """A node of a NodePool whose expireAfter is 720 h, created 721 h before Karpenter deleted it; do-not-disrupt
    held the pod for the pool's 24 h terminationGracePeriod."""
    pool = node_pool(f"{job['metadata']['name']}-pool", "720h")
    old = karpenter_node(f"{job['metadata']['name']}.node", created="2026-11-01T09:00:00Z",
                         deleting="2026-12-01T10:00:00Z")  # fmt: skip
    old["metadata"]["labels"]["karpenter.sh/nodepool"] = pool["metadata"]["name"]
    evicted_from(kubernetes, job, old, deleted="2026-12-01T10:00:00Z", by="2026-12-02T10:00:00Z", node_pools=[pool])


def failed_with_log(line: str) -> Seed:
    def seed(deployed: DeployedTeam, kubernetes: FakeKubernetes, job: dict[str, Any]) -> None:
        kubernetes.seed(job=job, pods=[pod(job, "0-e5r6t", phase="Failed", state=FAILED)])
        job_name = job["metadata"]["name"]
        name = f"{job_name}-0-e5r6t"
        lines = [(0, "starting"), (2, line)]
        put_lines(
            deployed, CLUSTER_LOGS, stream_of(name), [(at, fluent_bit(text, name, job=job_name)) for at, text in lines]
        )

    return seed


FAILURES: dict[str, tuple[Seed, str, str]] = {
    "oom": (oom, "oom-killed", '"OOMKilled"'),
    "spot": (spot, "spot-interrupted", f'"{SPOT_MESSAGE}"'),
    "no-gpus": (no_gpus, "unschedulable", '"Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."'),
    "image-pull": (image_pull, "image-pull", 'ImagePullBackOff "Back-off pulling image'),
    "node-repair": (node_repair, "node-repaired", f'AcceleratedHardwareReady=False {XID_REASON} "{XID_MESSAGE}"'),
    "expiry": (expiry, "expired", "721 h (30.0 days) old at its deletion: NodePool expiry-"),
    "refused": (failed_with_log(REFUSED), "connection-refused-at-start", f'"{REFUSED}"'),
    "denied": (failed_with_log(DENIED), "access-denied-at-start", '"botocore.exceptions.ClientError: An error'),
}


@pytest.mark.parametrize("kind", ["beacon", "foreign"])
@pytest.mark.parametrize("failure", list(FAILURES))
def test_the_first_line_names_the_cause_with_its_evidence_quoted(
    deployed: DeployedTeam, kubernetes: FakeKubernetes, failure: str, kind: str
) -> None:
    seed, cause, quoted = FAILURES[failure]
    name = f"{failure}-{kind}"
    job = beacon_job(name, active=0, failed=1) if kind == "beacon" else foreign_job(name, active=0, failed=1)
    seed(deployed, kubernetes, job)
    answer = answered(deployed, kubernetes, "--run" if kind == "beacon" else "--job", name)
    assert answer["headline"].startswith(f"{cause}: ") and quoted in answer["headline"], answer["headline"]
    assert ("delivery" in [v["check"] for v in answer["verdicts"]]) == (kind == "beacon"), "a run's evidence is read"
