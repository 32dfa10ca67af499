"""`beacon doctor` on what the orchestrator sees: one test per verdict, on the fake Kubernetes API.

The team is "deployed" into moto (tests/support/deployed_team.py); the cluster's state is seeded into the
fake Kubernetes API as the API would serve it (no kubelet, no training process). Each test runs the real
`beacon doctor` command and asserts its first line (the cause with quoted evidence) and its exit code.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

from beacon import contract

from beacon_ops.doctor.orchestrator import duration, kube_event, node_view
from beacon_ops.local.long_run import Attempt, write_long_run
from tests.support.deployed_team import BUCKET, TEAM, DeployedTeam
from tests.support.fake_kubernetes import FakeKubernetes
from tests.support.moto_server import REGION
from workloads import manifests

NS = contract.TRAINING_NAMESPACE
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/demo-images:v7"
T0 = "2026-12-01T10:00:00Z"
GPU_NODE = "ip-10-0-2-7.ec2.internal"
SPOT_MESSAGE = "Spot interruption warning was triggered"  # aws/karpenter-provider-aws interruption/events


def doctor(deployed: DeployedTeam, fake: FakeKubernetes | str, *args: str) -> subprocess.CompletedProcess[str]:
    url = fake if isinstance(fake, str) else fake.url
    return deployed.cli(*args, "--kubernetes-url", url, verb="doctor", timeout=120)


def answered(deployed: DeployedTeam, fake: FakeKubernetes | str, *args: str, code: int = 1) -> dict[str, Any]:
    """`beacon doctor ... --json`: its answer, once its exit code is `code`."""
    done = doctor(deployed, fake, *args, "--json")
    assert done.returncode == code, done.stdout + done.stderr
    return dict(json.loads(done.stdout))


def first_line(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout.splitlines()[0] if done.stdout else f"(no output; stderr: {done.stderr})"


# --- the cluster's objects, as the Kubernetes API serves them -----------------------------------------------------


def beacon_job(run: str, **status: Any) -> dict[str, Any]:
    """A Beacon run's Job, built by Beacon's one Job builder, with a status."""
    spec = manifests.TrainingJobSpec(
        team=TEAM, image=IMAGE, bucket=BUCKET, region=REGION, uid=1000, gid=1000, name=run, command=("train.py",)
    )
    job = manifests.training_job(spec)[0]
    job["metadata"]["creationTimestamp"] = T0
    return {**job, "status": status}


def foreign_job(name: str, **status: Any) -> dict[str, Any]:
    """A team's own Job, no Beacon in it."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": name}, "creationTimestamp": T0},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "train", "image": IMAGE, "env": [{"name": "EPOCHS", "value": "3"}]}],
                }
            }
        },
        "status": status,
    }


def pod(
    job: dict[str, Any],
    suffix: str,
    *,
    phase: str,
    state: dict[str, Any],
    node: str | None = GPU_NODE,
    conditions: list[dict[str, Any]] | None = None,
    memory: str | None = None,
    restarts: int = 0,
) -> dict[str, Any]:
    name = job["metadata"]["name"]
    container: dict[str, Any] = {"name": "train", "image": IMAGE}
    if memory:
        container["resources"] = {"limits": {"memory": memory}, "requests": {"memory": memory}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-{suffix}",
            "namespace": NS,
            "creationTimestamp": T0,
            "labels": {**job["metadata"]["labels"], "batch.kubernetes.io/job-name": name},
        },
        "spec": {"containers": [container], **({"nodeName": node} if node else {})},
        "status": {
            "phase": phase,
            "conditions": conditions or [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "train",
                    "image": IMAGE,
                    "imageID": "",
                    "ready": False,
                    "restartCount": restarts,
                    "state": state,
                }
            ],
        },
    }


def unschedulable(job: dict[str, Any], suffix: str, message: str) -> dict[str, Any]:
    """A pod the scheduler could not place: Pending, on no node, PodScheduled False."""
    scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    waiting = {"waiting": {"reason": "ContainerCreating"}}
    return pod(job, suffix, phase="Pending", node=None, state=waiting, conditions=[scheduled])


def event(
    kind: str, name: str, reason: str, message: str, at: str, *, source: str, kind_type: str = "Warning"
) -> dict[str, Any]:
    namespace = "default" if kind == "Node" else NS  # Kubernetes records a Node's events in `default`
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{abs(hash((reason, at))):x}", "namespace": namespace},
        "involvedObject": {"kind": kind, "name": name, **({"namespace": namespace} if kind != "Node" else {})},
        "reason": reason,
        "message": message,
        "type": kind_type,
        "lastTimestamp": at,
        "count": 1,
        "source": {"component": source},
    }


def spot_node(name: str) -> dict[str, Any]:
    labels = {
        "karpenter.sh/capacity-type": "spot",
        "karpenter.sh/nodepool": manifests.GPU_POOL,
        "node.kubernetes.io/instance-type": "g5.xlarge",
    }
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


XID_REASON = "NvidiaXID79Error"  # the EKS node monitoring agent's condition, as it sets it
XID_MESSAGE = "detected XID-79 on the instance, review kernel logs for additional information."
FORCEFUL = "Evicted pod: Forceful Termination"  # Karpenter's terminator, for a NodeClaim deleted outside disruption


def grace_expiring(node: str, by: str, at: str) -> dict[str, Any]:
    """Karpenter's event on the Node of a NodeClaim deleted while its NodePool sets terminationGracePeriod."""
    return event("Node", node, "TerminationGracePeriodExpiring", f"All pods will be deleted by {by}", at,
                 source="karpenter")  # fmt: skip


def force_deleted(pod_name: str, by: str, at: str) -> dict[str, Any]:
    """Karpenter's event on a pod it deletes to meet its node's termination time (node repair at once)."""
    message = (
        f"Deleting the pod to accommodate the terminationTime {by} of the node. The pod was granted 1 seconds of "
        "grace-period of its 120 terminationGracePeriodSeconds. This bypasses the PDB of the pod and the "
        "do-not-disrupt annotation."
    )
    return event("Pod", pod_name, "Disrupted", message, at, source="karpenter", kind_type="Normal")


def karpenter_node(
    name: str, *, created: str, deleting: str | None = None, conditions: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    """A node of Beacon's GPU NodePool, as the API serves it: its creation, its deletion while Karpenter drains
    it, and its conditions (the kubelet's Ready, the monitoring agent's AcceleratedHardwareReady)."""
    node = spot_node(name)
    node["metadata"]["creationTimestamp"] = created
    if deleting:
        node["metadata"]["deletionTimestamp"] = deleting
    node["status"] = {"conditions": [{"type": "Ready", "status": "True"}, *(conditions or [])]}
    return node


def xid_condition(since: str) -> dict[str, str]:
    return {"type": "AcceleratedHardwareReady", "status": "False", "reason": XID_REASON, "message": XID_MESSAGE,
            "lastTransitionTime": since}  # fmt: skip


def node_pool(name: str, expire_after: str) -> dict[str, Any]:
    template = {"spec": {"expireAfter": expire_after, "terminationGracePeriod": "24h"}}
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {"template": template},
    }


# --- one test per verdict ------------------------------------------------------------------------------------------


def put_heartbeats(deployed: DeployedTeam, run: str, at: list[datetime]) -> None:
    """Run `run`'s heartbeat samples in CloudWatch, as its telemetry thread puts them (high resolution)."""
    dims = contract.run_dimensions(TEAM, "smoke", run)
    deployed.client("cloudwatch").put_metric_data(
        Namespace=contract.metric_namespace(TEAM),
        MetricData=[
            {
                "MetricName": contract.HEARTBEAT.name,
                "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
                "Timestamp": when,
                "Value": 1.0,
                "StorageResolution": 1,
            }
            for when in at
        ],
    )


def test_an_oomkilled_beacon_run_leads_with_the_container_its_exit_code_and_its_memory_limit(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    job = beacon_job("oom-run", active=0, failed=1)
    oom = {
        "terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": T0, "finishedAt": "2026-12-01T10:04:12Z"}
    }
    kubernetes.seed(
        job=job, pods=[pod(job, "0-x7k2p", phase="Failed", state=oom, memory="16Gi")], nodes=[spot_node(GPU_NODE)]
    )
    done = doctor(deployed, kubernetes, "--run", "oom-run")
    assert done.returncode == 1, done.stderr
    assert first_line(done) == (
        f'oom-killed: container train of pod {NS}/oom-run-0-x7k2p on node {GPU_NODE}: "OOMKilled" (exit code 137) '
        "at 2026-12-01 10:04:12 UTC, memory limit 16Gi"
    )
    assert "resources.limits.memory" in done.stdout  # the fix, in the table (folded: one word at a time)


def test_a_beacon_job_evicted_by_a_spot_interruption_names_the_node_and_karpenters_event(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """The interrupted pod is gone and so is its node: the scheduler's and Karpenter's events still name them.
    Found by --job: the Job's container carries the run's settings, so the run's evidence is read too."""
    job = beacon_job("spot-run", active=1, failed=0)
    gone = "spot-run-0-aaaaa"
    waiting = unschedulable(job, "0-bbbbb", "0/2 nodes are available")
    kubernetes.seed(
        job=job,
        pods=[waiting],
        events=[
            event(
                "Pod",
                gone,
                "Scheduled",
                f"Successfully assigned {NS}/{gone} to {GPU_NODE}",
                T0,
                source="default-scheduler",
                kind_type="Normal",
            ),
            event("Node", GPU_NODE, "SpotInterrupted", SPOT_MESSAGE, "2026-12-01T10:05:00Z", source="karpenter"),
            event(
                "Node",
                GPU_NODE,
                "TerminatingOnInterruption",
                "Interruption triggered termination for the Node",
                "2026-12-01T10:05:01Z",
                source="karpenter",
            ),
            event(
                "Pod",
                gone,
                "Evicted",
                "Evicted pod: Forceful Termination",
                "2026-12-01T10:05:02Z",
                source="karpenter",
                kind_type="Normal",
            ),
        ],
    )
    answer = answered(deployed, kubernetes, "--job", "spot-run")
    assert answer["headline"] == (
        f'spot-interrupted: node {GPU_NODE}: SpotInterrupted "{SPOT_MESSAGE}" at 2026-12-01 10:05:00 UTC; '
        f'pod {gone}: Evicted "Evicted pod: Forceful Termination" at 2026-12-01 10:05:02 UTC'
    )
    assert answer["run"] == "spot-run" and answer["lead"] == "orchestrator"
    checks = [v["check"] for v in answer["verdicts"]]
    assert checks[0] == "orchestrator" and "delivery" in checks  # the run's evidence was read as well
    fix = answer["verdicts"][0]["fix"]
    assert "checkpoint" in fix and "on-demand" in fix
    assert answer["orchestrator"]["job"]["nodes"] == [
        {
            "name": GPU_NODE,
            "exists": False,
            "capacity_type": "",
            "node_pool": "",
            "instance_type": "",
            "created_at": None,
            "deleting_since": None,
            "unhealthy": [],
            "expire_after": None,
            "instance_id": "",
            "node_claim": "",
        }
    ]


def test_a_foreign_job_pending_for_lack_of_gpus_quotes_the_scheduler_and_karpenter(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    job = foreign_job("llm-finetune", active=1)
    insufficient = (
        "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: "
        "3 No preemption victims found for incoming pod."
    )
    karpenter = (
        f'Failed to schedule pod, incompatible with nodepool "{manifests.GPU_POOL}", all available instance types '
        f'exceed limits for nodepool: "{manifests.GPU_POOL}"'
    )
    pending = unschedulable(job, "q9w8e", insufficient)
    kubernetes.seed(
        job=job,
        pods=[pending],
        events=[
            event(
                "Pod",
                "llm-finetune-q9w8e",
                "FailedScheduling",
                insufficient,
                "2026-12-01T10:00:05Z",
                source="default-scheduler",
            ),
            event(
                "Pod", "llm-finetune-q9w8e", "FailedScheduling", karpenter, "2026-12-01T10:00:06Z", source="karpenter"
            ),
        ],
    )
    answer = answered(deployed, kubernetes, "--job", "llm-finetune")
    assert answer["headline"] == (
        f'unschedulable: pod {NS}/llm-finetune-q9w8e Pending: "Unschedulable: {insufficient}"; '
        f'pod llm-finetune-q9w8e: FailedScheduling "{karpenter}" at 2026-12-01 10:00:06 UTC'
    )
    fix = answer["verdicts"][0]["fix"]
    assert "raise compute.gpu_limit in the team file" in fix and "quota" in fix


def test_a_foreign_job_whose_image_cannot_be_pulled_names_the_image_and_the_reason(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    job = foreign_job("etl-train", active=1)
    back_off = f'Back-off pulling image "{IMAGE}"'
    stuck = pod(job, "m3n4b", phase="Pending", state={"waiting": {"reason": "ImagePullBackOff", "message": back_off}})
    kubernetes.seed(job=job, pods=[stuck])
    answer = answered(deployed, kubernetes, "--job", "etl-train")
    assert answer["headline"] == (
        f'image-pull: container train of pod {NS}/etl-train-m3n4b on node {GPU_NODE}: ImagePullBackOff "{back_off}" '
        f"(image {IMAGE})"
    )
    assert "AmazonEC2ContainerRegistryPullOnly" in answer["verdicts"][0]["fix"]


def test_a_beacon_job_whose_artifact_volume_cannot_be_mounted_quotes_the_kubelets_event(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """The third step of the usual search, after the Job and the log: the volume mount."""
    job = beacon_job("mount-run", active=1)
    stuck = pod(job, "0-q8w2e", phase="Pending", state={"waiting": {"reason": "ContainerCreating"}})
    message = (
        'MountVolume.SetUp failed for volume "beacon-artifacts" : rpc error: code = Internal desc = '
        'Could not mount "fs-0abc:/" at "/var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/pv/mount": '
        "mount failed: exit status 32: Connection timed out"
    )
    mount = event("Pod", "mount-run-0-q8w2e", "FailedMount", message, "2026-12-01T10:01:00Z", source="kubelet")
    kubernetes.seed(job=job, pods=[stuck], events=[mount])
    answer = answered(deployed, kubernetes, "--run", "mount-run")
    assert answer["headline"] == (
        f'volume-mount: pod mount-run-0-q8w2e: FailedMount "{message}" at 2026-12-01 10:01:00 UTC'
    )
    assert "TCP 2049" in answer["verdicts"][0]["fix"]


def test_a_foreign_job_that_failed_says_what_only_beacons_library_could_tell(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    job = foreign_job("plain-job", active=0, failed=1)
    job["status"]["conditions"] = [
        {
            "type": "Failed",
            "status": "True",
            "reason": "BackoffLimitExceeded",
            "message": "Job has reached the specified backoff limit",
        }
    ]
    error = {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": T0, "finishedAt": "2026-12-01T10:01:30Z"}}
    kubernetes.seed(job=job, pods=[pod(job, "k1l2j", phase="Failed", state=error)])
    answer = answered(deployed, kubernetes, "--job", "plain-job")
    assert answer["headline"] == (
        f'exit-code: container train of pod {NS}/plain-job-k1l2j on node {GPU_NODE}: "Error", exit code 1 '
        "at 2026-12-01 10:01:30 UTC"
    )
    beacon = next(v for v in answer["verdicts"] if v["check"] == "beacon")
    assert beacon["status"] == "info" and "no heartbeat" in beacon["evidence"] and "import beacon" in beacon["fix"]
    assert [v["check"] for v in answer["verdicts"]] == ["orchestrator", "logs", "beacon"]  # no S3, no CloudWatch read
    state = answer["orchestrator"]["job"]
    assert state["conditions"][0]["reason"] == "BackoffLimitExceeded" and state["beacon"] == {}
    assert state["pods"][0]["containers"][0]["exit_code"] == 1


def test_a_healthy_foreign_job_passes_with_exit_code_zero(deployed: DeployedTeam, kubernetes: FakeKubernetes) -> None:
    job = foreign_job("done-job", active=0, succeeded=1)
    job["status"]["conditions"] = [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-12-01T11:00:00Z"}]
    finished = {
        "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": T0, "finishedAt": "2026-12-01T11:00:00Z"}
    }
    kubernetes.seed(job=job, pods=[pod(job, "p0o9i", phase="Succeeded", state=finished)])
    done = doctor(deployed, kubernetes, "--job", "done-job")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        first_line(done)
        == f"finished: Job {NS}/done-job Complete at 2026-12-01 11:00:00 UTC: 1 pod(s) succeeded, 0 failed"
    )


def test_a_healthy_beacon_run_through_the_orchestrator_and_its_logs_passes_with_exit_code_zero(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """A Beacon run that finished (its records, index, preflight and final state in S3) on a Job that completed,
    its log ordinary: every source the doctor reads agrees, and it says so with exit code 0."""
    write_long_run(deployed.client("s3"), bucket=BUCKET, experiment="smoke", run="fine-run",
                   attempts=[Attempt(0, 600)])  # fmt: skip
    job = beacon_job("fine-run", active=0, succeeded=1)
    job["status"]["conditions"] = [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-12-01T11:00:00Z"}]
    finished = {
        "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": T0, "finishedAt": "2026-12-01T11:00:00Z"}
    }
    kubernetes.seed(job=job, pods=[pod(job, "0-f1n3r", phase="Succeeded", state=finished)])
    answer = answered(deployed, kubernetes, "--run", "fine-run", code=0)
    assert answer["diagnosis"] == "finished", answer["headline"]
    statuses = {v["check"]: v["status"] for v in answer["verdicts"]}
    assert statuses["orchestrator"] == "ok" and statuses["job"] == "ok" and statuses["liveness"] == "ok", statuses
    assert "fail" not in statuses.values(), answer["verdicts"]


def test_a_beacon_run_whose_cluster_cannot_be_reached_gets_an_info_verdict_not_a_crash(
    deployed: DeployedTeam,
) -> None:
    answer = answered(deployed, "http://127.0.0.1:9", "--run", "nobody-run")
    orchestrator = answer["verdicts"][0]
    assert orchestrator["check"] == "orchestrator" and orchestrator["status"] == "info"
    assert orchestrator["verdict"] == "unreadable" and "cannot reach the Kubernetes API" in orchestrator["evidence"]
    assert "--kubernetes-url" in orchestrator["fix"]
    assert answer["lead"] != "orchestrator"  # Beacon's own evidence leads: the cluster said nothing


def test_a_forbidden_event_list_is_a_note_and_the_job_is_still_diagnosed(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    job = foreign_job("quiet-job", active=1)
    kubernetes.seed(job=job, pods=[pod(job, "r5t6y", phase="Running", state={"running": {"startedAt": T0}})])
    kubernetes.forbidden.add(f"/api/v1/namespaces/{NS}/events")
    answer = answered(deployed, kubernetes, "--job", "quiet-job", code=0)
    assert answer["diagnosis"] == "healthy"
    assert any("refused listing the events of namespace" in n for n in answer["orchestrator"]["notes"])
    # Created on 2026-12-01, read now: the events of its first hour are gone, and the doctor says so
    assert any(n.startswith("Kubernetes keeps events for 1 h:") for n in answer["orchestrator"]["notes"])
    fresh = foreign_job("fresh-job", active=1)
    fresh["metadata"]["creationTimestamp"] = f"{datetime.now(UTC) - timedelta(minutes=5):%Y-%m-%dT%H:%M:%SZ}"
    kubernetes.seed(job=fresh, pods=[pod(fresh, "f1f2f", phase="Running", state={"running": {"startedAt": T0}})])
    quiet = answered(deployed, kubernetes, "--job", "fresh-job", code=0)
    assert not any("keeps events" in n for n in quiet["orchestrator"]["notes"]), "a Job younger than an hour"


def test_a_forceful_termination_of_a_node_that_is_gone_names_what_it_can_have_been(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """The pod was evicted for a NodeClaim deleted outside Karpenter's disruption methods, and the node is gone:
    its conditions and age went with it. Not "evicted" (node pressure): the three causes, and how to tell."""
    job = foreign_job("gone-node", active=0, failed=1)
    gone = "gone-node-0-k8l9m"
    placed = f"Successfully assigned {NS}/{gone} to {GPU_NODE}"
    events = [
        event("Pod", gone, "Scheduled", placed, T0, source="default-scheduler", kind_type="Normal"),
        event("Pod", gone, "Evicted", FORCEFUL, "2026-12-01T10:30:00Z", source="karpenter"),
    ]
    kubernetes.seed(job=job, pods=[], events=events)
    answer = answered(deployed, kubernetes, "--job", "gone-node")
    assert answer["headline"] == (
        f'forcefully-terminated: pod {gone}: Evicted "{FORCEFUL}" at 2026-12-01 10:30:00 UTC'
    ), answer["headline"]
    fix = answer["verdicts"][0]["fix"]
    assert "expiry" in fix and "node repair" in fix and "by hand" in fix and "deleting unhealthy node" in fix


def test_an_expired_node_still_holding_a_do_not_disrupt_pod_is_draining_not_failed(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """Karpenter deleted a 721 h old node (expireAfter 720 h); do-not-disrupt holds the training pod until the
    pool's 24 h terminationGracePeriod ends: the job still runs there, and will be deleted by then."""
    job = foreign_job("long-job", active=1)
    old = karpenter_node(GPU_NODE, created="2026-11-01T09:00:00Z", deleting="2026-12-01T10:00:00Z")
    running = pod(job, "d1r2n", phase="Running", state={"running": {"startedAt": T0}})
    events = [grace_expiring(GPU_NODE, "2026-12-02T10:00:00Z", "2026-12-01T10:00:00Z")]
    kubernetes.seed(job=job, pods=[running], events=events, nodes=[old],
                    node_pools=[node_pool(manifests.GPU_POOL, "720h")])  # fmt: skip
    answer = answered(deployed, kubernetes, "--job", "long-job")
    first = answer["verdicts"][0]
    assert (first["status"], first["verdict"]) == ("warn", "expired, draining"), first
    assert "All pods will be deleted by 2026-12-02T10:00:00Z" in first["evidence"]
    assert first["evidence"].endswith("still running on the draining node: long-job-d1r2n")
    assert "gpu_training_pool in beacon_constructs/karpenter_manifests.py" in first["fix"]


def test_a_node_repaired_and_gone_from_a_beacon_pool_is_a_forceful_termination_not_an_eviction(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """On Beacon's pools (terminationGracePeriod set) node repair deletes the pod at once ("Disrupted", not
    "Evicted"), and the Node hears "All pods will be deleted by": once the node is gone, that is all there is."""
    job = foreign_job("xid-gone", active=0, failed=1)
    gone = "xid-gone-0-z0x9c"
    events = [
        event("Pod", gone, "Scheduled", f"Successfully assigned {NS}/{gone} to {GPU_NODE}", T0,
              source="default-scheduler", kind_type="Normal"),
        grace_expiring(GPU_NODE, "2026-12-01T10:12:30Z", "2026-12-01T10:12:30Z"),
        force_deleted(gone, "2026-12-01 10:12:30 +0000 UTC", "2026-12-01T10:12:31Z"),
    ]  # fmt: skip
    kubernetes.seed(job=job, events=events)
    answer = answered(deployed, kubernetes, "--job", "xid-gone")
    assert answer["diagnosis"] == "forcefully-terminated", answer["headline"]
    assert 'Disrupted "Deleting the pod to accommodate the terminationTime' in answer["headline"]
    assert "node pressure" not in answer["verdicts"][0]["fix"], "not the eviction's advice"


def test_a_node_with_a_failed_gpu_that_karpenter_may_not_repair_is_named_with_the_blocking_event(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """The pod crashed on a node whose GPU failed (AcceleratedHardwareReady False); too many nodes of the
    NodePool are unhealthy for node repair to act (Karpenter's NodeRepairBlocked on the node)."""
    job = foreign_job("xid-job", active=0, failed=1)
    sick = karpenter_node(GPU_NODE, created=T0, conditions=[xid_condition("2026-12-01T10:20:00Z")])
    blocked = "more than 20% nodes are unhealthy in the nodepool"  # NodeRepairBlocked, node/health/controller.go
    events = [event("Node", GPU_NODE, "NodeRepairBlocked", blocked, "2026-12-01T10:31:00Z", source="karpenter")]
    crashed = pod(job, "x1d2e", phase="Failed", state={"terminated": {"exitCode": 1, "reason": "Error"}})
    kubernetes.seed(job=job, pods=[crashed], events=events, nodes=[sick])
    answer = answered(deployed, kubernetes, "--job", "xid-job")
    assert answer["headline"] == (
        f'node-unhealthy: node {GPU_NODE}: AcceleratedHardwareReady=False {XID_REASON} "{XID_MESSAGE}" since '
        f'2026-12-01 10:20:00 UTC; node {GPU_NODE}: NodeRepairBlocked "{blocked}" at 2026-12-01 10:31:00 UTC'
    ), answer["headline"]
    assert "cordon and drain it by hand" in answer["verdicts"][0]["fix"]
    moments = [m["what"] for m in answer["timeline"]]
    condition = f'AcceleratedHardwareReady=False {XID_REASON} "{XID_MESSAGE}" since 2026-12-01 10:20:00 UTC'
    assert moments.index(f"node {GPU_NODE} created") < moments.index(f"node {GPU_NODE}: {condition}"), moments


def test_a_nodepool_the_doctor_may_not_read_is_a_note_and_an_old_node_is_not_called_expired(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    old = karpenter_node(GPU_NODE, created="2026-10-01T09:00:00Z", deleting="2026-12-01T10:00:00Z")
    job = foreign_job("old-node", active=0, failed=1)
    gone = "old-node-0-p0o9i"
    events = [
        event("Pod", gone, "Scheduled", f"Successfully assigned {NS}/{gone} to {GPU_NODE}", T0,
              source="default-scheduler", kind_type="Normal"),
        event("Pod", gone, "Evicted", FORCEFUL, "2026-12-01T10:00:05Z", source="karpenter"),
    ]  # fmt: skip
    kubernetes.seed(job=job, events=events, nodes=[old], node_pools=[node_pool(manifests.GPU_POOL, "720h")])
    kubernetes.forbidden.add("/apis/karpenter.sh/")
    answer = answered(deployed, kubernetes, "--job", "old-node")
    assert answer["diagnosis"] == "forcefully-terminated", "no expireAfter read: no claim of expiry"
    assert any(f"refused reading NodePool {manifests.GPU_POOL}" in n for n in answer["orchestrator"]["notes"])


def test_an_event_recorded_through_the_events_api_is_placed_at_its_last_occurrence() -> None:
    """The scheduler and Karpenter record through events.k8s.io: served as core/v1, lastTimestamp is null, eventTime
    is the first occurrence and series the repeats (kubernetes/api events/v1 EventSeries)."""
    served = {
        "involvedObject": {"kind": "Pod", "name": "p"}, "reason": "FailedScheduling", "message": "0/3 nodes",
        "type": "Warning", "lastTimestamp": None, "firstTimestamp": None, "eventTime": "2026-12-01T10:00:00.000000Z",
        "series": {"count": 7, "lastObservedTime": "2026-12-01T10:06:00.000000Z"},
        "reportingComponent": "default-scheduler",
    }  # fmt: skip
    placed = kube_event(served)
    assert (placed.at, placed.count, placed.source) == (
        datetime(2026, 12, 1, 10, 6, tzinfo=UTC),
        7,
        "default-scheduler",
    )
    once = kube_event({**served, "series": None})
    assert (once.at, once.count) == (datetime(2026, 12, 1, 10, 0, tzinfo=UTC), 1)


def test_a_node_is_placed_as_far_as_the_api_says_its_instance_its_nodeclaim_and_the_conditions_repair_acts_on() -> None:
    """Issue 31: a rank's node, named beside the rank (a slow one, a hung one): its EC2 instance from its providerID,
    the NodeClaim Karpenter registered it under (its owner reference), and what node repair would act on."""
    node = {
        "metadata": {"name": GPU_NODE, "labels": {"node.kubernetes.io/instance-type": "g6.12xlarge"},
                     "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": "gpu-x7k2p",
                                          "uid": "u1", "blockOwnerDeletion": True}]},
        "spec": {"providerID": "aws:///us-east-1a/i-0123456789abcdef0"},
        "status": {"conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": T0},
            {"type": "AcceleratedHardwareReady", "status": "False", "reason": "XidError", "message": "Xid 79",
             "lastTransitionTime": T0},
        ]},
    }  # fmt: skip
    view = node_view(GPU_NODE, node)
    assert (view.instance_id, view.node_claim) == ("i-0123456789abcdef0", "gpu-x7k2p")
    assert view.placed() == (
        'instance i-0123456789abcdef0, NodeClaim gpu-x7k2p, AcceleratedHardwareReady=False XidError "Xid 79" '
        "since 2026-12-01 10:00:00 UTC"
    )
    elsewhere = node_view("n", {"metadata": {}, "spec": {"providerID": "gce://p/z/n"}})
    assert (elsewhere.instance_id, elsewhere.node_claim, elsewhere.placed()) == ("", "", "")


def test_go_durations_as_nodepools_write_them() -> None:
    assert duration("720h") == timedelta(hours=720) and duration("1h30m") == timedelta(minutes=90)
    assert duration("90s") == timedelta(seconds=90) and duration("2.5h") == timedelta(hours=2.5)
    for never in ("Never", "", None, "720", "1d", "h"):
        assert duration(never) is None, never


def test_the_timeline_lines_up_the_metrics_gap_with_the_oom_kill_and_the_spot_interruption(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """Heartbeats every 15 s until 10:04:10, the container OOMKilled at 10:04:12, Karpenter's spot warning at
    10:04:00: the timeline places each from the gap (the last heartbeat), oldest first, after the cause."""
    now = datetime.now(UTC).replace(microsecond=0)
    gap = now - timedelta(minutes=5)

    def stamp(offset_s: int) -> str:
        return f"{gap + timedelta(seconds=offset_s):%Y-%m-%dT%H:%M:%SZ}"

    job = beacon_job("oom-timeline", active=0, failed=1)
    job["metadata"]["creationTimestamp"] = stamp(-300)
    oom = {"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": stamp(-290), "finishedAt": stamp(2)}}
    killed = pod(job, "0-x7k2p", phase="Failed", state=oom, memory="16Gi")
    killed["metadata"]["creationTimestamp"] = stamp(-295)
    warning = event("Node", GPU_NODE, "SpotInterrupted", SPOT_MESSAGE, stamp(-10), source="karpenter")
    kubernetes.seed(job=job, pods=[killed], events=[warning], nodes=[spot_node(GPU_NODE)])
    put_heartbeats(deployed, "oom-timeline", [gap + timedelta(seconds=offset) for offset in range(-270, 1, 15)])
    answer = answered(deployed, kubernetes, "--run", "oom-timeline")
    assert answer["diagnosis"] == "oom-killed"
    moments = [(m["source"], m["what"], m["from_gap_s"]) for m in answer["timeline"]]
    assert [m for m in moments if m[0] != "orchestrator" or "OOMKilled" in m[1] or "Spot" in m[1]] == [
        ("metrics", "first heartbeat", -270.0),
        ("orchestrator", f"Warning SpotInterrupted on Node {GPU_NODE}: {SPOT_MESSAGE}", -10.0),
        ("metrics", "last heartbeat", 0.0),
        ("orchestrator", "container train of pod oom-timeline-0-x7k2p ended OOMKilled (exit code 137)", 2.0),
    ], moments
    assert moments[0] == ("orchestrator", "Job oom-timeline created", -300.0)
    shown = doctor(deployed, kubernetes, "--run", "oom-timeline").stdout.splitlines()
    assert shown[1] == "timeline (t = the run's last heartbeat, else its newest record):", shown[:3]
    assert any(
        line.endswith(
            "t+2 s  orchestrator: container train of pod oom-timeline-0-x7k2p ended OOMKilled (exit code 137)"
        )
        for line in shown
    ), shown
