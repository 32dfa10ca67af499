"""What the orchestrator knows about a job, as plain data, and the verdict it gives.

The state is read elsewhere (`eks_state.py` reads it through the Kubernetes API) and handed to the
diagnosis as an optional input: the alarm's Lambda diagnoses without it and imports nothing of
Kubernetes. Here: the Kubernetes JSON of a Job, its pods and the events on them and on their nodes,
parsed into dataclasses with timestamps, and one verdict that names the cause with quoted evidence.
Pure: no I/O, no printing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from beacon_ops.doctor.verdict import FAIL, INFO, OK, WARN, Verdict

CHECK = "orchestrator"
# The Beacon settings a Job's container carries (workloads/manifests.py `_environment`): a Job that has them is a
# Beacon run, whatever its name, and the doctor can read that run's evidence too.
BEACON_ENVIRONMENT = ("BEACON_TEAM", "BEACON_EXPERIMENT", "BEACON_RUN_ID")

# Waiting reasons of a container whose image never arrives (kubelet's images.ErrImagePullBackOff & co.).
IMAGE_PULL_REASONS = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"})
CONFIG_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
# The kubelet's and the attach/detach controller's events when a pod's volume cannot be attached or mounted
# (kubernetes pkg/kubelet/events/event.go: FailedMountVolume = "FailedMount"; FailedAttachVolume).
VOLUME_REASONS = frozenset({"FailedMount", "FailedAttachVolume"})

# Karpenter's event reasons, as published (statement level):
# - aws/karpenter-provider-aws pkg/controllers/interruption/events/events.go (1d92708, 2026-08): on the Node and
#   its NodeClaim, "SpotInterrupted" ("Spot interruption warning was triggered"), "InstanceTerminating",
#   "InstanceStopping", "InstanceUnhealthy", "CapacityReservationInstanceInterrupted" and
#   "TerminatingOnInterruption" ("Interruption triggered termination for the Node").
INTERRUPTION_REASONS = frozenset(
    {
        "SpotInterrupted",
        "TerminatingOnInterruption",
        "InstanceTerminating",
        "InstanceStopping",
        "InstanceUnhealthy",
        "CapacityReservationInstanceInterrupted",
    }
)
# - kubernetes-sigs/karpenter pkg/events/reason.go and pkg/controllers/disruption/events/events.go (2266468,
#   2026-08): "DisruptionTerminating" on the Node ("Disrupting Node: Underutilized|Empty|Drifted", the reason
#   title-cased); pkg/controllers/node/termination/terminator/events/events.go: on the pod, "Evicted"
#   ("Evicted pod: <the NodeClaim's DisruptionReason condition, or Forceful Termination>") and "Disrupted"
#   (deleted to meet the node's terminationGracePeriod, bypassing do-not-disrupt); "FailedDraining" and
#   "TerminationGracePeriodExpiring" on the Node. Expiry (nodeclaim/expiration) deletes the NodeClaim with no
#   event of its own: it shows as the eviction's "Forceful Termination".
DISRUPTION_REASONS = frozenset({"DisruptionTerminating"})
# On the Node of any NodeClaim deleted while its NodePool sets terminationGracePeriod (Beacon's pools do): "All pods
# will be deleted by <T>" (node/termination/controller.go). It says when, not why: every deletion method sends it.
GRACE_EXPIRING = "TerminationGracePeriodExpiring"
# The eviction message of a NodeClaim deleted outside Karpenter's disruption methods (pkg/controllers/node/
# termination/terminator/eviction.go): expiry, node repair, an interruption, or a deletion by hand.
FORCEFUL_TERMINATION = "Forceful Termination"
# A pod deleted, not evicted, to meet the node's termination time (its "Disrupted" event, terminator/events): what
# node repair does at once (it sets that time to now), and expiry once terminationGracePeriod runs out. It bypasses
# the pod's PDB and do-not-disrupt.
FORCE_DELETED = "Deleting the pod to accommodate the terminationTime"
# Node repair (kubernetes-sigs/karpenter pkg/controllers/node/health, 2266468) deletes the NodeClaim of a node
# that holds one of the cloud provider's unhealthy conditions past its toleration; it records no event of its own
# (NodeRepairBlocked only when too many nodes are unhealthy to repair). AWS's policies (karpenter-provider-aws
# pkg/cloudprovider/cloudprovider.go RepairPolicies, 1d92708): the kubelet's Ready False or Unknown for 30 min;
# the EKS node monitoring agent's AcceleratedHardwareReady False for 10 min, and StorageReady, NetworkingReady,
# KernelReady and ContainerRuntimeReady False for 30 min.
REPAIR_POLICIES: dict[tuple[str, str], timedelta] = {
    ("Ready", "False"): timedelta(minutes=30),
    ("Ready", "Unknown"): timedelta(minutes=30),
    ("AcceleratedHardwareReady", "False"): timedelta(minutes=10),
    ("StorageReady", "False"): timedelta(minutes=30),
    ("NetworkingReady", "False"): timedelta(minutes=30),
    ("KernelReady", "False"): timedelta(minutes=30),
    ("ContainerRuntimeReady", "False"): timedelta(minutes=30),
}
NODE_REPAIR_BLOCKED = "NodeRepairBlocked"
NODE_POOL_LABEL = "karpenter.sh/nodepool"  # on each node Karpenter launches: its NodePool's name
# The EKS node monitoring agent (aws/eks-node-monitoring-agent pkg/manager/node_exporter.go, 51af549) sets those
# conditions False with reasons like NvidiaXID79Error ("detected XID-79 on the instance, ..."), and records its
# warnings as events on the Node whose reason is the condition's type.
POD_EVICTION_REASONS = frozenset({"Evicted", "Disrupted", "Preempted", "Preempting"})
# - the scheduler's and Karpenter's provisioner's "FailedScheduling" (pkg/controllers/provisioning/scheduling/
#   events.go: "Failed to schedule pod, <why>") and "Nominated" ("Pod should schedule on: nodeclaim/...").
FAILED_SCHEDULING, NOMINATED = "FailedScheduling", "Nominated"
GPU_RESOURCE = "nvidia.com/gpu"
# kube-scheduler's default binder event: "Successfully assigned <ns>/<pod> to <node>".
ASSIGNED = re.compile(r"Successfully assigned \S+ to (\S+)")


def parse_time(value: Any) -> datetime | None:
    if not value or not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class KubeEvent:
    kind: str  # of the object it is about: Job, Pod, Node, NodeClaim
    name: str
    reason: str
    message: str
    type: str  # Normal or Warning
    at: datetime | None
    count: int = 1
    source: str = ""  # the component that reported it (default-scheduler, karpenter, kubelet)

    def quoted(self) -> str:
        return f'{self.kind.lower()} {self.name}: {self.reason} "{self.message}"'


@dataclass(frozen=True)
class ContainerView:
    name: str
    image: str
    init: bool
    state: str  # waiting, running, terminated or unknown
    reason: str = ""
    message: str = ""
    exit_code: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    restarts: int = 0
    last_reason: str = ""  # the previous run of a restarted container
    last_exit_code: int | None = None
    last_finished_at: datetime | None = None
    memory_limit: str | None = None


@dataclass(frozen=True)
class PodState:
    name: str
    phase: str
    node: str
    created_at: datetime | None
    reason: str = ""  # status.reason: Evicted by the kubelet, for one
    message: str = ""
    unschedulable: str = ""  # PodScheduled=False: its reason and message
    disruption: str = ""  # DisruptionTarget=True: its reason and message
    deleting: bool = False
    containers: tuple[ContainerView, ...] = ()


@dataclass(frozen=True)
class NodeHealth:
    """One of the node's conditions that Karpenter's node repair acts on (REPAIR_POLICIES), as it holds now."""

    type: str
    status: str
    reason: str
    message: str
    since: datetime | None
    tolerated_for: timedelta  # node repair deletes the node's NodeClaim once it held this long

    def quoted(self) -> str:
        said = f' {self.reason} "{self.message}"' if self.message else f" {self.reason}" if self.reason else ""
        since = f" since {self.since:%Y-%m-%d %H:%M:%S} UTC" if self.since else ""
        return f"{self.type}={self.status}{said}{since}"


@dataclass(frozen=True)
class NodeView:
    name: str
    exists: bool
    capacity_type: str = ""  # karpenter.sh/capacity-type: spot or on-demand
    node_pool: str = ""
    instance_type: str = ""
    created_at: datetime | None = None
    deleting_since: datetime | None = None  # its deletionTimestamp: Karpenter drains it
    unhealthy: tuple[NodeHealth, ...] = ()
    expire_after: timedelta | None = None  # its NodePool's, when the doctor could read that NodePool
    instance_id: str = ""  # the EC2 instance, from its providerID (aws:///<zone>/<instance id>)
    node_claim: str = ""  # the Karpenter NodeClaim that owns it

    def placed(self) -> str:
        """Where this node is, as far as the API says: its instance, its NodeClaim, the conditions node repair acts on
        that hold now; "" when it says none."""
        said = [f"instance {self.instance_id}" if self.instance_id else "", f"NodeClaim {self.node_claim}" if
                self.node_claim else "", *(health.quoted() for health in self.unhealthy)]  # fmt: skip
        return ", ".join(part for part in said if part)


@dataclass(frozen=True)
class JobCondition:
    type: str
    status: str
    reason: str
    message: str
    at: datetime | None


@dataclass(frozen=True)
class JobState:
    namespace: str
    name: str
    created_at: datetime | None
    conditions: tuple[JobCondition, ...]
    active: int
    succeeded: int
    failed: int
    labels: dict[str, str] = field(default_factory=dict)
    beacon: dict[str, str] = field(default_factory=dict)  # BEACON_TEAM, _EXPERIMENT, _RUN_ID of its container
    pods: tuple[PodState, ...] = ()
    events: tuple[KubeEvent, ...] = ()  # on the Job, its pods (gone ones too) and their nodes, oldest first
    nodes: tuple[NodeView, ...] = ()

    def condition(self, kind: str) -> JobCondition | None:
        return next((c for c in self.conditions if c.type == kind and c.status == "True"), None)


@dataclass(frozen=True)
class OrchestratorState:
    """The orchestrator's answer about one job, or why there is none (`problem`, with `fix`)."""

    platform: str  # eks
    cluster: str
    namespace: str
    job_name: str
    read_at: datetime
    job: JobState | None = None
    problem: str = ""
    fix: str = ""
    notes: tuple[str, ...] = ()  # what could not be read beside the job (node events, say), and why


# --- parsing the Kubernetes JSON (camelCase, as the API serves it) ----------------------------------------------


def _container(status: dict[str, Any], spec: dict[str, Any], *, init: bool) -> ContainerView:
    state = status.get("state") or {}
    last = (status.get("lastState") or {}).get("terminated") or {}
    limits = (spec.get("resources") or {}).get("limits") or {}
    kind, found = next(iter(state.items()), ("unknown", None))
    detail: dict[str, Any] = found or {}
    return ContainerView(
        name=str(status.get("name", "")),
        image=str(status.get("image") or spec.get("image") or ""),
        init=init,
        state=kind,
        reason=str(detail.get("reason") or ""),
        message=str(detail.get("message") or ""),
        exit_code=detail.get("exitCode"),
        started_at=parse_time(detail.get("startedAt")),
        finished_at=parse_time(detail.get("finishedAt")),
        restarts=int(status.get("restartCount") or 0),
        last_reason=str(last.get("reason") or ""),
        last_exit_code=last.get("exitCode"),
        last_finished_at=parse_time(last.get("finishedAt")),
        memory_limit=limits.get("memory"),
    )


def pod_state(pod: dict[str, Any]) -> PodState:
    metadata, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    scheduled, target = conditions.get("PodScheduled") or {}, conditions.get("DisruptionTarget") or {}
    specs = {c.get("name"): c for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]}
    containers = [
        _container(s, specs.get(s.get("name")) or {}, init=init)
        for init, key in ((True, "initContainerStatuses"), (False, "containerStatuses"))
        for s in status.get(key) or []
    ]
    return PodState(
        name=str(metadata.get("name", "")),
        phase=str(status.get("phase") or "Unknown"),
        node=str(spec.get("nodeName") or ""),
        created_at=parse_time(metadata.get("creationTimestamp")),
        reason=str(status.get("reason") or ""),
        message=str(status.get("message") or ""),
        unschedulable=(
            f"{scheduled.get('reason') or 'Unschedulable'}: {scheduled.get('message') or ''}".strip()
            if scheduled.get("status") == "False"
            else ""
        ),
        disruption=(
            f"{target.get('reason') or 'DisruptionTarget'}: {target.get('message') or ''}".strip()
            if target.get("status") == "True"
            else ""
        ),
        deleting=bool(metadata.get("deletionTimestamp")),
        containers=tuple(containers),
    )


def kube_event(event: dict[str, Any]) -> KubeEvent:
    involved = event.get("involvedObject") or event.get("regarding") or {}
    source = event.get("source") or {}
    # An event recorded through the events.k8s.io API (the scheduler's, Karpenter's) has no lastTimestamp: its
    # eventTime is the first occurrence, and a repeated one's last is series.lastObservedTime.
    series = event.get("series") or {}
    at = (
        parse_time(series.get("lastObservedTime"))
        or parse_time(event.get("lastTimestamp"))
        or parse_time(event.get("eventTime"))
        or parse_time(event.get("firstTimestamp"))
        or parse_time((event.get("metadata") or {}).get("creationTimestamp"))
    )
    return KubeEvent(
        kind=str(involved.get("kind") or ""),
        name=str(involved.get("name") or ""),
        reason=str(event.get("reason") or ""),
        message=str(event.get("message") or event.get("note") or "").strip(),
        type=str(event.get("type") or ""),
        at=at,
        count=int(series.get("count") or event.get("count") or 1),
        source=str(
            source.get("component") or event.get("reportingComponent") or event.get("reportingController") or ""
        ),
    )


def duration(text: Any) -> timedelta | None:
    """A Go duration as NodePools write expireAfter (`720h`, `1h30m`, `90s`); None for `Never` or unreadable."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|m|s)", text) if isinstance(text, str) else []
    if not parts or "".join(f"{n}{u}" for n, u in parts) != text:
        return None
    unit = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return timedelta(seconds=sum(float(n) * unit[u] for n, u in parts))


def node_health(node: dict[str, Any]) -> tuple[NodeHealth, ...]:
    found = []
    for condition in (node.get("status") or {}).get("conditions") or []:
        key = (str(condition.get("type")), str(condition.get("status")))
        if key in REPAIR_POLICIES:
            found.append(
                NodeHealth(
                    *key,
                    reason=str(condition.get("reason") or ""),
                    message=str(condition.get("message") or "").strip(),
                    since=parse_time(condition.get("lastTransitionTime")),
                    tolerated_for=REPAIR_POLICIES[key],
                )
            )
    return tuple(found)


def node_view(name: str, node: dict[str, Any] | None, pools: dict[str, dict[str, Any]] | None = None) -> NodeView:
    """A node as the API serves it; `pools`, the NodePools read by name, give it its pool's expireAfter."""
    if node is None:
        return NodeView(name, exists=False)
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    owners = metadata.get("ownerReferences") or []  # Karpenter's NodeClaim owns the nodes it registers
    pool = (pools or {}).get(str(labels.get(NODE_POOL_LABEL) or ""))
    template = (((pool or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    return NodeView(
        name,
        exists=True,
        capacity_type=str(
            labels.get("karpenter.sh/capacity-type") or labels.get("eks.amazonaws.com/capacityType") or ""
        ),
        node_pool=str(labels.get(NODE_POOL_LABEL) or ""),
        instance_type=str(labels.get("node.kubernetes.io/instance-type") or ""),
        created_at=parse_time(metadata.get("creationTimestamp")),
        deleting_since=parse_time(metadata.get("deletionTimestamp")),
        unhealthy=node_health(node),
        expire_after=duration(template.get("expireAfter")),
        instance_id=instance_of(str((node.get("spec") or {}).get("providerID") or "")),
        node_claim=next((str(o.get("name") or "") for o in owners if o.get("kind") == "NodeClaim"), ""),
    )


def instance_of(provider_id: str) -> str:
    """The EC2 instance id of a node's providerID (`aws:///us-east-1a/i-0123456789abcdef0`); "" for another cloud's."""
    return provider_id.rsplit("/", 1)[-1] if provider_id.startswith("aws://") else ""


def belongs_to_job(job_name: str, kind: str, name: str, pods: set[str]) -> bool:
    """An event on the Job, on one of its pods, or on a pod of it that is gone (`<job>-<index>-<hash>`,
    `<job>-<hash>`)."""
    if kind == "Job":
        return name == job_name
    return kind == "Pod" and (name in pods or name.startswith(f"{job_name}-"))


def pod_nodes(pods: list[PodState], events: list[KubeEvent]) -> dict[str, str]:
    """Each pod of the job and the node it ran on, gone pods too while the scheduler's `Scheduled` event lasts."""
    placed = {e.name: m[1] for e in events if e.reason == "Scheduled" and (m := ASSIGNED.search(e.message))}
    return placed | {p.name: p.node for p in pods if p.node}


def nodes_of(pods: list[PodState], events: list[KubeEvent]) -> list[str]:
    """The nodes the job's pods ran on, gone pods included (the scheduler's `Scheduled` event names them)."""
    return list(dict.fromkeys(pod_nodes(pods, events).values()))


def job_state(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    events: list[dict[str, Any]],
    nodes: dict[str, dict[str, Any] | None] | None = None,
    node_pools: dict[str, dict[str, Any]] | None = None,
) -> JobState:
    """The Job, its pods, and every event given that concerns it or its nodes, oldest first; `node_pools` by
    name, as read for the nodes' NODE_POOL_LABEL."""
    metadata, status = job.get("metadata") or {}, job.get("status") or {}
    name = str(metadata.get("name", ""))
    template = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    environment = {
        str(e.get("name")): str(e.get("value"))
        for c in template.get("containers") or []
        for e in c.get("env") or []
        if "value" in e
    }
    states = sorted((pod_state(p) for p in pods), key=lambda p: p.created_at or datetime.min.replace(tzinfo=UTC))
    pod_names = {p.name for p in states}
    parsed = [kube_event(e) for e in events]
    node_names = set(nodes_of(states, parsed)) | set(nodes or {})
    mine = [
        e
        for e in parsed
        if belongs_to_job(name, e.kind, e.name, pod_names) or (e.kind == "Node" and e.name in node_names)
    ]
    mine.sort(key=lambda e: e.at or datetime.min.replace(tzinfo=UTC))
    return JobState(
        namespace=str(metadata.get("namespace", "")),
        name=name,
        created_at=parse_time(metadata.get("creationTimestamp")),
        conditions=tuple(
            JobCondition(
                str(c.get("type")),
                str(c.get("status")),
                str(c.get("reason") or ""),
                str(c.get("message") or ""),
                parse_time(c.get("lastTransitionTime")),
            )
            for c in status.get("conditions") or []
        ),
        active=int(status.get("active") or 0),
        succeeded=int(status.get("succeeded") or 0),
        failed=int(status.get("failed") or 0),
        labels=dict(metadata.get("labels") or {}),
        beacon={k: environment[k] for k in BEACON_ENVIRONMENT if k in environment},
        pods=tuple(states),
        events=tuple(mine),
        nodes=tuple(node_view(n, (nodes or {}).get(n), node_pools) for n in sorted(node_names)),
    )


# --- the verdict ----------------------------------------------------------------------------------------------


def _at(when: datetime | None) -> str:
    return f" at {when:%Y-%m-%d %H:%M:%S} UTC" if when else ""


def _where(job: JobState, pod: PodState, container: ContainerView | None = None) -> str:
    what = f"pod {job.namespace}/{pod.name}"
    what = f"container {container.name} of {what}" if container else what
    return f"{what} on node {pod.node}" if pod.node else what


def _node(job: JobState, name: str) -> NodeView | None:
    return next((n for n in job.nodes if n.name == name), None)


def _running(job: JobState) -> list[PodState]:
    return [p for p in job.pods if p.phase == "Running" and not p.deleting]


def _never_started(job: JobState) -> Verdict | None:
    """A container waiting for an image that does not come, or for config that is not there."""
    for pod in job.pods:
        for c in pod.containers:
            if c.state != "waiting" or c.reason not in IMAGE_PULL_REASONS | CONFIG_REASONS:
                continue
            quoted = f'{_where(job, pod, c)}: {c.reason} "{c.message or "no message"}"'
            if c.reason in IMAGE_PULL_REASONS:
                fix = (
                    f"push {c.image} or fix its name and tag; for ECR, the node role needs "
                    "AmazonEC2ContainerRegistryPullOnly and the repository's policy must admit it "
                    "(a team's images: <ImageRepositoryUri>:<tag>, pulled by that team's nodes only)"
                )
                return Verdict(CHECK, FAIL, "image-pull", f"{quoted} (image {c.image})", fix)
            fix = (
                "the pod refers to a Secret, ConfigMap, key or volume that is not there, or to a user the "
                f"image lacks: create it in namespace {job.namespace} or fix the Job's spec"
            )
            return Verdict(CHECK, FAIL, "container-config", quoted, fix)
    return None


def _volume(job: JobState) -> Verdict | None:
    """A pod that cannot start because its volume does not attach or mount (the artifact volume on EFS, say)."""
    waiting = {p.name for p in job.pods if p.phase == "Pending" and p.node and not _running(job)}
    event = next((e for e in reversed(job.events) if e.kind == "Pod" and e.reason in VOLUME_REASONS), None)
    if event is None or (job.pods and event.name not in waiting):
        return None
    return Verdict(
        CHECK,
        FAIL,
        "volume-mount",
        f"{event.quoted()}{_at(event.at)}" + (f" (x{event.count})" if event.count > 1 else ""),
        f"the pod's volume cannot be mounted on its node: for Beacon's artifact volume (PVC beacon-artifacts in "
        f"{job.namespace}, EFS) check the EFS CSI driver add-on, the mount targets' security group (NFS, TCP 2049, "
        "from the nodes) and the access point; `kubectl describe pod` shows the mount's own error",
    )


def _oom(job: JobState) -> Verdict | None:
    for pod in reversed(job.pods):
        for c in pod.containers:
            if c.reason == "OOMKilled" or c.last_reason == "OOMKilled":
                current = c.reason == "OOMKilled"
                code = c.exit_code if current else c.last_exit_code
                when = c.finished_at if current else c.last_finished_at
                limit = f"memory limit {c.memory_limit}" if c.memory_limit else "no memory limit (the node's memory)"
                restarted = f", restarted {c.restarts} time(s)" if c.restarts else ""
                raise_it = (
                    f"raise resources.limits.memory of container {c.name} above {c.memory_limit}"
                    if c.memory_limit
                    else f"give container {c.name} a memory request and limit that fit, on a larger instance type"
                )
                return Verdict(
                    CHECK,
                    FAIL,
                    "oom-killed",
                    f'{_where(job, pod, c)}: "OOMKilled" (exit code {code}){_at(when)}, {limit}{restarted}',
                    f"{raise_it}, or lower the batch size or the DataLoader's workers and prefetch; "
                    "a rerun with the same run id resumes from the last checkpoint",
                )
    return None


def _held(health: NodeHealth, until: datetime | None) -> timedelta | None:
    return until - health.since if until is not None and health.since is not None else None


def _repaired(job: JobState, until: datetime | None) -> tuple[NodeView, NodeHealth] | None:
    """A job node that held an unhealthy condition past its toleration by `until` (its deletion, or an eviction
    from it): node repair's doing. Without a time, any unhealthy node of the job that is being deleted."""
    for node in job.nodes:
        for health in node.unhealthy:
            held = _held(health, node.deleting_since or until)
            if (held is not None and held >= health.tolerated_for) or (held is None and node.deleting_since):
                return node, health
    return None


def _expired(job: JobState, until: datetime | None) -> tuple[NodeView, timedelta] | None:
    """A job node older than its NodePool's expireAfter when it was deleted (or its pods evicted)."""
    for node in job.nodes:
        when = node.deleting_since or until
        if node.created_at and node.expire_after and when and when - node.created_at >= node.expire_after:
            return node, when - node.created_at
    return None


def _age(span: timedelta) -> str:
    hours = span.total_seconds() / 3600
    return f"{hours:.1f} h" if hours < 48 else f"{hours:.0f} h ({hours / 24:.1f} days)"


def _interruption(job: JobState) -> Verdict | None:
    """Karpenter's interruption and disruption events on the job's nodes, the evictions of its pods, and what a
    forceful termination was (node repair, expiry) when the node shows it."""
    node_events = [e for e in job.events if e.kind == "Node" and e.reason in INTERRUPTION_REASONS | DISRUPTION_REASONS]
    grace = [e for e in job.events if e.kind == "Node" and e.reason == GRACE_EXPIRING]
    pod_events = [e for e in job.events if e.kind == "Pod" and e.reason in POD_EVICTION_REASONS]
    evicted = [p for p in job.pods if p.disruption or p.reason == "Evicted"]
    if not (node_events or grace or pod_events or evicted):
        return None
    spot = [e for e in node_events if e.reason in INTERRUPTION_REASONS]
    cause = next(iter(spot or node_events or pod_events or grace), None)
    facts = [f"{e.quoted()}{_at(e.at)}" for e in (cause, *pod_events[:1], *grace[:1]) if e is not None]
    facts += [f"pod {job.namespace}/{p.name}: {p.disruption or p.reason + ' ' + repr(p.message)}" for p in evicted[:1]]
    facts = list(dict.fromkeys(facts))
    draining = {n.name for n in job.nodes if n.deleting_since}
    resumed = [p for p in _running(job) if p.node not in draining]  # one still on a draining node is not resumed
    node = _node(job, cause.name) if cause is not None and cause.kind == "Node" else None
    pool = f" (NodePool {node.node_pool}, {node.capacity_type or '?'} capacity)" if node and node.node_pool else ""
    forceful = [
        *(e for e in pod_events if FORCEFUL_TERMINATION in e.message or FORCE_DELETED in e.message),
        *(p for p in evicted if FORCEFUL_TERMINATION in p.disruption + p.message),
        *grace,
    ]
    evicted_at = next((e.at for e in [*pod_events, *grace] if e.at is not None), None)
    repaired = _repaired(job, evicted_at) if not node_events else None
    expired = _expired(job, evicted_at) if not node_events else None
    if spot:
        name, fix = (
            "spot-interrupted",
            f"EC2 took the node back{pool} with a 2-minute notice, which do-not-disrupt cannot block: "
            "checkpoint often enough that a lost node costs little, or run the job on an on-demand NodePool "
            "(karpenter.sh/capacity-type: on-demand); the Job's retry resumes from the last checkpoint",
        )
    elif cause is not None and cause.reason == "DisruptionTerminating":
        name, fix = (
            "disrupted",
            f"Karpenter removed the node{pool} ({cause.message}): give training pods the annotation "
            "karpenter.sh/do-not-disrupt: \"true\" (Beacon's Job builder does), and set the NodePool's "
            "disruption budgets, expireAfter and terminationGracePeriod so training nodes are not consolidated, "
            "drifted or expired under a run",
        )
    elif repaired is not None:
        sick, health = repaired
        held = _held(health, sick.deleting_since or evicted_at)
        kind = f" ({sick.instance_type})" if sick.instance_type else ""
        facts.insert(
            0,
            f"node {sick.name}: {health.quoted()}"
            + (f", held {_age(held)} (node repair acts after {_age(health.tolerated_for)})" if held else ""),
        )
        name, fix = (
            "node-repaired",
            f"Karpenter's node repair replaced node {sick.name}{kind}: its {health.type} condition held past its "
            "toleration (a GPU's Xid or DCGM failure for "
            "AcceleratedHardwareReady; a kubelet that stopped reporting for Ready). The Job's retry resumes from "
            "the last checkpoint; if the instance type fails again, leave it out of the NodePool's requirements or "
            "report the instance to AWS Support",
        )
    elif expired is not None:
        old, age = expired
        assert old.expire_after is not None
        facts.insert(
            0,
            f"node {old.name}, {_age(age)} old at its deletion: "
            f"NodePool {old.node_pool} expireAfter {_age(old.expire_after)}",
        )
        name, fix = (
            "expired",
            f"the NodePool {old.node_pool}'s expireAfter replaced a node older than {_age(old.expire_after)} "
            "under the run (expiry is forceful: do-not-disrupt holds it for the NodePool's "
            "terminationGracePeriod, no longer). The Job's retry resumes from the last checkpoint; for runs that "
            "long, raise the NodePool's expireAfter where it is defined (Beacon's: gpu_training_pool in "
            "beacon_constructs/karpenter_manifests.py, then cdk deploy: a kubectl edit is undone by the next "
            "deploy), or checkpoint before a node's age comes due",
        )
    elif forceful:
        name, fix = (
            "forcefully-terminated",
            "Karpenter deleted the node outside its disruption methods (consolidation and drift leave a "
            "DisruptionTerminating event, a Spot interruption its SpotInterrupted): expiry (the NodePool's "
            "expireAfter), node repair (an unhealthy node condition held past its toleration) or a deletion by "
            "hand (kubectl delete node or nodeclaim). Once the node is gone, its conditions and age are too: "
            "Karpenter's own log says \"deleting unhealthy node\" for a repair. The Job's retry resumes from "
            "the last checkpoint",
        )
    else:
        name, fix = (
            "evicted",
            "the pod was evicted (node pressure, preemption, or a node drained): give it requests equal to "
            "its limits, a priority class, or a node of its own; the Job's retry resumes from the last checkpoint",
        )
    if resumed:
        return Verdict(
            CHECK,
            WARN,
            f"{name}{RESUMED}",
            f"{'; '.join(facts)}; now running: {', '.join(p.name for p in resumed)}",
            fix,
        )
    if still := [p for p in _running(job) if p.node in draining]:  # do-not-disrupt holds them until the grace ends
        return Verdict(
            CHECK,
            WARN,
            f"{name}{DRAINING}",
            f"{'; '.join(facts)}; still running on the draining node: {', '.join(p.name for p in still)}",
            fix,
        )
    return Verdict(CHECK, FAIL, name, "; ".join(facts), fix)


def _node_health(job: JobState) -> Verdict | None:
    """A node of the job's running or failed pods holding a condition node repair acts on, nothing evicted yet: its
    pods crash or hang on it (a GPU's Xid), and Karpenter replaces it once the toleration is over, unless too many
    nodes are unhealthy (NodeRepairBlocked)."""
    pods_on = {p.node for p in job.pods if p.node}
    for node in job.nodes:
        if node.name not in pods_on or not node.unhealthy:
            continue
        health = node.unhealthy[0]
        blocked = [
            e for e in job.events if e.kind == "Node" and e.name == node.name and e.reason == NODE_REPAIR_BLOCKED
        ]
        facts = [f"node {node.name}: {health.quoted()}", *(f"{e.quoted()}{_at(e.at)}" for e in blocked[-1:])]
        repair = (
            "Karpenter will not repair it while too many nodes are unhealthy (NodeRepairBlocked): cordon and drain "
            "it by hand"
            if blocked
            else f"Karpenter's node repair replaces it {_age(health.tolerated_for)} after the condition began"
        )
        return Verdict(
            CHECK,
            WARN if _running(job) else FAIL,
            "node-unhealthy",
            "; ".join(facts),
            f"the node's {health.type} condition says it cannot run the job well (for AcceleratedHardwareReady, a "
            f"GPU's Xid or DCGM failure): {repair}; the Job's retry resumes from the last checkpoint on another node",
        )
    return None


def _exit_code(job: JobState) -> Verdict | None:
    for pod in reversed(job.pods):
        for c in pod.containers:
            code = c.exit_code if c.state == "terminated" else c.last_exit_code
            reason = c.reason if c.state == "terminated" else c.last_reason
            if code:
                return Verdict(
                    CHECK,
                    FAIL,
                    "exit-code",
                    f'{_where(job, pod, c)}: "{reason or "Error"}", exit code {code}'
                    f"{_at(c.finished_at or c.last_finished_at)}"
                    f"{f', restarted {c.restarts} time(s)' if c.restarts else ''}",
                    f"read its log: kubectl -n {job.namespace} logs {pod.name} -c {c.name}"
                    f"{' --previous' if c.state != 'terminated' else ''}; Beacon's runtime exits 2 on bad input "
                    "and 3 on a failed preflight",
                )
    return None


def _unschedulable(job: JobState) -> Verdict | None:
    pending = [p for p in job.pods if p.phase == "Pending" and p.unschedulable]
    if not pending:
        return None
    pod = pending[-1]
    scheduling = [e for e in job.events if e.name == pod.name and e.reason in (FAILED_SCHEDULING, NOMINATED)]
    last = scheduling[-1] if scheduling else None
    failed = [e for e in scheduling if e.reason == FAILED_SCHEDULING]
    evidence = f'pod {job.namespace}/{pod.name} Pending: "{pod.unschedulable}"'
    karpenter = [e for e in failed if e.source == "karpenter" or e.message.startswith("Failed to schedule pod")]
    if karpenter:
        evidence += f"; {karpenter[-1].quoted()}{_at(karpenter[-1].at)}"
    if last is not None and last.reason == NOMINATED:
        return Verdict(
            CHECK,
            WARN,
            "waiting-for-node",
            f"{evidence}; {last.quoted()}{_at(last.at)}",
            "Karpenter is launching a node for it: GPU instances take minutes to join",
        )
    if GPU_RESOURCE in evidence:
        fix = (
            f"no node offers the {GPU_RESOURCE} it requests: raise compute.gpu_limit in the team file (the GPU "
            "NodePool's limit), widen compute.gpu_instance_families or gpu_instance_types, and make deploy; or ask AWS "
            "for more G/P-instance vCPU quota (Service Quotas, EC2, Spot or On-Demand); `kubectl get nodepools` shows "
            "what each pool has used"
        )
    else:
        fix = (
            "no NodePool matches the pod's requirements, tolerations or node selector, or every pool is at its "
            "limits: compare the pod's nodeSelector/affinity and tolerations with `kubectl get nodepools -o yaml`"
        )
    return Verdict(CHECK, FAIL, "unschedulable", evidence, fix)


def _job_failed(job: JobState) -> Verdict | None:
    failed = job.condition("Failed")
    if failed is None:
        return None
    return Verdict(
        CHECK,
        FAIL,
        "job-failed",
        f'Job {job.namespace}/{job.name} Failed{_at(failed.at)}: {failed.reason} "{failed.message}"',
        f"kubectl -n {job.namespace} describe job {job.name}: its pods and their exit codes",
    )


RESUMED = ", resumed"  # the suffix of a verdict whose job lost a pod and runs again
DRAINING = ", draining"  # ... whose pods still run on a node Karpenter is deleting (until its grace period ends)


def running_now(verdict: Verdict) -> bool:
    """The orchestrator says the job runs now, whatever happened before (a restart, a node lost and resumed)."""
    return verdict.check == CHECK and (
        verdict.verdict in ("running", "restarted") or verdict.verdict.endswith((RESUMED, DRAINING))
    )


def orchestrator_verdict(state: OrchestratorState) -> Verdict:
    """The cause the orchestrator sees, most telling first: a container that never started (its image, its
    config), one the kernel killed for memory, a node taken away, an exit code, a pod that cannot be placed."""
    if state.problem:
        return Verdict(CHECK, INFO, "unreadable", state.problem, state.fix)
    job = state.job
    if job is None:
        return Verdict(
            CHECK,
            WARN,
            "no job",
            f"no Job {state.namespace}/{state.job_name} on cluster {state.cluster}",
            "it may have ended more than its ttlSecondsAfterFinished ago (Beacon's: 24 h), or run in another "
            "namespace (--namespace)",
        )
    complete = job.condition("Complete")
    if complete is not None:
        return Verdict(
            CHECK,
            OK,
            "complete",
            f"Job {job.namespace}/{job.name} Complete{_at(complete.at)}: {job.succeeded} pod(s) succeeded, "
            f"{job.failed} failed",
        )
    for check in (_never_started, _volume, _oom, _interruption, _node_health, _exit_code, _unschedulable, _job_failed):
        verdict = check(job)
        if verdict is not None:
            return verdict
    running = _running(job)
    restarts = sum(c.restarts for p in job.pods for c in p.containers)
    if running:
        text = f"Job {job.namespace}/{job.name}: {', '.join(f'{p.name} Running on {p.node}' for p in running)}"
        if restarts:
            return Verdict(CHECK, WARN, "restarted", f"{text}; {restarts} restart(s)", "see the pods' previous logs")
        return Verdict(CHECK, OK, "running", text)
    phases = ", ".join(f"{p.name} {p.phase}" for p in job.pods) or "no pod yet"
    return Verdict(CHECK, INFO, "starting", f"Job {job.namespace}/{job.name}: {phases}")
