"""Kubernetes objects for any training Job, its volume and its service account, as plain dicts.

`training_job` builds a Job for any image and command with every safety setting: the volume, a
securityContext equal to the access point's, a per-rank liveness probe, a podFailurePolicy,
do-not-disrupt, a grace period beyond the drain budget, multi-node as an Indexed Job with a headless
Service, and the `BEACON_*` environment `beacon.init` reads. The smoke Job is one such Job: the
cluster stack and `beacon smoke` both build it here, so a post-deploy smoke test runs exactly what
the stack runs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from beacon import contract
from beacon.contract.pace import SLOW_RANK_SHARE, slow_rank_share_problem
from beacon.contract.rank_evidence import FLIGHT_RECORDER_ENTRIES, FLIGHT_RECORDER_PREFIX

from config.model import TeamConfig

TRAINING_SERVICE_ACCOUNT = "training"
ARTIFACTS_CLAIM = "beacon-artifacts"
ARTIFACTS_VOLUME = "beacon-artifacts"
STORAGE_CLASS = "beacon-efs"
ARTIFACTS_MOUNT = "/artifacts"
RUNTIME_DIR = "/var/run/beacon"
HEARTBEAT_FILE = f"{RUNTIME_DIR}/heartbeat"
RENDEZVOUS_PORT = contract.RENDEZVOUS_PORT
HEARTBEAT_TOLERANCE_S = contract.SILENT_BUDGET_S  # never the 30 s default
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
POOL_LABEL = "beacon/pool"
GPU_POOL, CPU_POOL = "gpu-training", "cpu-smoke"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
# Bad input (2) and a failed preflight (3) will not get better with a retry.
NON_RETRIABLE_EXIT_CODES = [contract.EXIT_BAD_INPUT, contract.EXIT_PREFLIGHT]
# torchrun, keeping the job's exit code (beacon/launch.py); the image has no other entry point.
LAUNCH_COMMAND = ["python", "-m", "beacon.launch"]


# Pod Security Admission on the training namespace: no host network, PID or IPC, no privileged container, no hostPath
# (a pod on the host's network reaches the node's instance metadata, and its role, whatever the hop limit).
POD_SECURITY_LEVEL = "baseline"


def namespace(name: str = contract.TRAINING_NAMESPACE) -> dict[str, Any]:
    labels = {
        "beacon/managed": "true",
        "pod-security.kubernetes.io/enforce": POD_SECURITY_LEVEL,
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


# Every pod of the training namespace runs on a Beacon pool (Karpenter's nodes: IMDSv2, hop limit 1), never on a
# system node, whose instance metadata answers a pod with the node's role at EKS's default hop limit of 2: a
# ValidatingAdmissionPolicy refuses, at creation, a pod that selects no pool (an operator's `kubectl run` debug pod)
# or names its node itself. Each rule: (CEL expression over the pod, the message when it does not hold).
POOL_RULES = (
    (
        "has(object.spec.nodeSelector) && '%(label)s' in object.spec.nodeSelector && "
        "object.spec.nodeSelector['%(label)s'] in %(pools)s",
        "pods in %(namespace)s run on Beacon's pools: set nodeSelector %(label)s to one of %(pools)s (a pod elsewhere "
        "lands on a system node, whose instance metadata hands out the node's role)",
    ),
    (
        "!has(object.spec.nodeName) || object.spec.nodeName == ''",
        "pods in %(namespace)s are placed by the scheduler on Beacon's pools: spec.nodeName is refused",
    ),
)
POOL_POLICY_NAME = "beacon-training-pods-on-beacon-pools"


def pool_admission_policy(ns: str = contract.TRAINING_NAMESPACE) -> list[dict[str, Any]]:
    """The policy and its binding (Deny), matching pods created in `ns`."""
    values = {"label": POOL_LABEL, "pools": json.dumps([GPU_POOL, CPU_POOL]).replace('"', "'"), "namespace": ns}
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POOL_POLICY_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                ],
            },
            "validations": [{"expression": rule % values, "message": message % values} for rule, message in POOL_RULES],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POOL_POLICY_NAME},
        "spec": {"policyName": POOL_POLICY_NAME, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def service_account(name: str = TRAINING_SERVICE_ACCOUNT, ns: str = contract.TRAINING_NAMESPACE) -> dict[str, Any]:
    # No IRSA annotation: EKS Pod Identity binds the writer role to this account.
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}}


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS},
        "provisioner": "efs.csi.aws.com",
        "reclaimPolicy": "Retain",
        "volumeBindingMode": "Immediate",
    }


EFS_MOUNT_OPTIONS = ("iam", "tls")
EFS_CSI_NODE_SERVICE_ACCOUNT = "efs-csi-node-sa"  # the driver's node pods mount; `iam` uses their identity
EFS_CSI_NAMESPACE = "kube-system"  # where the managed EFS CSI add-on runs its controller and node pods


def persistent_volume(file_system_id: str, access_point_id: str) -> dict[str, Any]:
    """A static volume on the access point, so every write is owned by the training uid/gid."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": ARTIFACTS_VOLUME},
        "spec": {
            "capacity": {"storage": "1Ti"},  # EFS is elastic; Kubernetes needs a number
            "volumeMode": "Filesystem",
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            # The file system refuses anonymous clients: mount as the driver's IAM identity, over TLS.
            "mountOptions": list(EFS_MOUNT_OPTIONS),
            "csi": {"driver": "efs.csi.aws.com", "volumeHandle": f"{file_system_id}::{access_point_id}"},
        },
    }


# `beacon doctor` reads beyond the training namespace, read-only: the nodes its pods ran on (capacity type,
# NodePool) and the events on them, which Kubernetes records in `default` (Karpenter's interruption and
# disruption events among them). EKS access policies cannot be narrowed to that, so RBAC of its own, bound to
# a group the operators' access entries carry.
DOCTOR_READERS_GROUP = "beacon:doctor-readers"
DOCTOR_NODE_READER = "beacon-doctor-node-reader"
NODE_EVENTS_NAMESPACE = "default"


def doctor_read_access() -> list[dict[str, Any]]:
    """Get and list of nodes (cluster-wide) and of the events in `default`, get of Karpenter's NodePools (their
    expireAfter tells an expired node): nothing else, nothing written."""
    subjects = [{"kind": "Group", "name": DOCTOR_READERS_GROUP, "apiGroup": "rbac.authorization.k8s.io"}]
    read = ["get", "list"]
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "name": DOCTOR_NODE_READER}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": DOCTOR_NODE_READER},
            "rules": [
                {"apiGroups": [""], "resources": ["nodes"], "verbs": read},
                {"apiGroups": ["karpenter.sh"], "resources": ["nodepools"], "verbs": ["get"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": DOCTOR_NODE_READER},
            "roleRef": {**role_ref, "kind": "ClusterRole"},
            "subjects": subjects,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": DOCTOR_NODE_READER, "namespace": NODE_EVENTS_NAMESPACE},
            "rules": [{"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": read}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": DOCTOR_NODE_READER, "namespace": NODE_EVENTS_NAMESPACE},
            "roleRef": {**role_ref, "kind": "Role"},
            "subjects": subjects,
        },
    ]


def persistent_volume_claim(ns: str = contract.TRAINING_NAMESPACE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": ARTIFACTS_CLAIM, "namespace": ns},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": STORAGE_CLASS,
            "volumeName": ARTIFACTS_VOLUME,
            "resources": {"requests": {"storage": "1Ti"}},
        },
    }


# What Kubernetes accepts as a Job name that also names its pods' hostnames and the headless Service.
JOB_NAME_LIMIT = 52  # 63 minus "-ranks" and an index suffix


@dataclass(frozen=True)
class TrainingJobSpec:
    """One training job of a team on its stack: any image, any command torchrun runs."""

    team: str
    image: str
    bucket: str
    region: str
    uid: int
    gid: int
    name: str  # the Job's name and the run id: restarts of this Job resume the same run
    command: tuple[str, ...]  # what torchrun runs: a script and its arguments, or "-m", a module, ...
    experiment: str = "default"
    nodes: int = 1
    processes_per_node: int = 1
    gpu: bool = False
    heartbeat_interval: int = contract.HEARTBEAT_INTERVAL_S
    slow_rank_share: float = SLOW_RANK_SHARE  # the team file's monitoring.slow_rank_share
    shutdown_budget: int = 60
    namespace: str = contract.TRAINING_NAMESPACE
    environment: tuple[tuple[str, str], ...] = ()  # beside the BEACON_* settings
    app: str = "beacon-training"  # the pods' app.kubernetes.io/name

    def __post_init__(self) -> None:
        problems = []
        if not contract.is_id(self.name) or len(self.name) > JOB_NAME_LIMIT:
            problems.append(f"name {self.name!r}: 1-{JOB_NAME_LIMIT} of a-z, 0-9 and '-'")
        if not self.command:
            problems.append("command: empty (a script and its arguments, or -m and a module)")
        for field_name in ("nodes", "processes_per_node", "heartbeat_interval", "shutdown_budget"):
            if getattr(self, field_name) < 1:
                problems.append(f"{field_name}: must be >= 1, got {getattr(self, field_name)}")
        if problem := slow_rank_share_problem(self.slow_rank_share):
            problems.append(f"slow_rank_share: {problem}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def service_name(self) -> str:
        return f"{self.name}-ranks"


def _torchrun_args(spec: TrainingJobSpec, *, sagemaker: bool = False) -> list[str]:
    if sagemaker:  # each instance's own, from SageMaker's resource configuration (`beacon.launch`)
        rendezvous = [contract.SAGEMAKER_RENDEZVOUS]
    elif spec.nodes == 1:
        rendezvous = ["--standalone"]
    else:
        rendezvous = [
            f"--nnodes={spec.nodes}",
            "--node-rank=$(JOB_COMPLETION_INDEX)",
            f"--master-addr={spec.name}-0.{spec.service_name}.{spec.namespace}.svc",
            f"--master-port={RENDEZVOUS_PORT}",
        ]
    return [*rendezvous, f"--nproc-per-node={spec.processes_per_node}", *spec.command]


def _environment(
    spec: TrainingJobSpec,
    *,
    volume: str = ARTIFACTS_MOUNT,
    heartbeat_file: str = HEARTBEAT_FILE,
) -> dict[str, str]:
    flight_recorder = f"{volume}/spool/{spec.experiment}/{spec.name}/{contract.RANKS}/{FLIGHT_RECORDER_PREFIX}"
    return {
        "BEACON_TEAM": spec.team,
        "BEACON_EXPERIMENT": spec.experiment,
        "BEACON_RUN_ID": spec.name,  # restarts of this Job resume the same run
        "BEACON_BUCKET": spec.bucket,
        "BEACON_SPOOL_DIR": f"{volume}/spool",
        "BEACON_CHECKPOINT_DIR": f"{volume}/checkpoints",
        "BEACON_HEARTBEAT_INTERVAL": str(spec.heartbeat_interval),
        "BEACON_SLOW_RANK_SHARE": f"{spec.slow_rank_share:g}",
        "BEACON_HEARTBEAT_FILE": heartbeat_file,
        "BEACON_SHUTDOWN_BUDGET": str(spec.shutdown_budget),
        # PyTorch's flight recorder: each rank's last collectives, dumped beside its progress signal
        # when a collective times out (`beacon.evidence.ranks`).
        "TORCH_FR_BUFFER_SIZE": str(FLIGHT_RECORDER_ENTRIES),
        "TORCH_NCCL_TRACE_BUFFER_SIZE": str(FLIGHT_RECORDER_ENTRIES),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": flight_recorder,
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": flight_recorder,
        **dict(spec.environment),
        "AWS_REGION": spec.region,
        "PYTHONUNBUFFERED": "1",
    }


def liveness_files(processes_per_node: int) -> list[str]:
    """One pod-local file per local rank: every rank of every pod shows its own sign of life."""
    return [contract.liveness_file(HEARTBEAT_FILE, rank) for rank in range(processes_per_node)]


def _all_ranks_started(processes_per_node: int) -> list[str]:
    return ["sh", "-c", " && ".join(f"test -f {path}" for path in liveness_files(processes_per_node))]


def _all_ranks_alive(processes_per_node: int, tolerance: int) -> list[str]:
    checks = " && ".join(
        f"test $(( now - $(stat -c %Y {path}) )) -lt {tolerance}" for path in liveness_files(processes_per_node)
    )
    return ["sh", "-c", f"now=$(date +%s) && {checks}"]


def training_job(spec: TrainingJobSpec) -> list[dict[str, Any]]:
    """The Job (an Indexed Job; with several nodes, also the headless Service for rendezvous)."""
    labels = {"app.kubernetes.io/name": spec.app, "beacon/team": spec.team}
    resources: dict[str, Any] = {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"memory": "4Gi"},
    }
    if spec.gpu:
        resources["requests"]["nvidia.com/gpu"] = str(spec.processes_per_node)
        resources["limits"]["nvidia.com/gpu"] = str(spec.processes_per_node)
    pod_spec: dict[str, Any] = {
        "serviceAccountName": TRAINING_SERVICE_ACCOUNT,
        "restartPolicy": "Never",  # podFailurePolicy requires it; the Job decides on retries
        "terminationGracePeriodSeconds": spec.shutdown_budget + 60,
        "securityContext": {
            "runAsUser": spec.uid,
            "runAsGroup": spec.gid,
            "fsGroup": spec.gid,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "nodeSelector": {POOL_LABEL: GPU_POOL if spec.gpu else CPU_POOL},
        "initContainers": [
            {
                "name": "volume-check",
                "image": spec.image,
                # A volume the training uid cannot write loses every record: fail here, with one line, before training.
                "command": [
                    "sh",
                    "-c",
                    f"touch {ARTIFACTS_MOUNT}/.beacon-write-check && rm {ARTIFACTS_MOUNT}/.beacon-write-check "
                    f'|| {{ echo "{ARTIFACTS_MOUNT} is not writable by uid $(id -u): check the access point '
                    f'and fsGroup" >&2; exit 1; }}',
                ],
                "volumeMounts": [{"name": "artifacts", "mountPath": ARTIFACTS_MOUNT}],
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }
        ],
        "containers": [
            {
                "name": "train",
                "image": spec.image,
                "command": LAUNCH_COMMAND,
                "args": _torchrun_args(spec),
                "env": [{"name": k, "value": v} for k, v in _environment(spec).items()]
                + [  # where each rank runs, for its progress signal (`beacon.evidence.ranks`)
                    {"name": "BEACON_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "BEACON_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                ],
                "resources": resources,
                "ports": [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT}],
                "startupProbe": {
                    "exec": {"command": _all_ranks_started(spec.processes_per_node)},
                    "periodSeconds": 10,
                    "failureThreshold": 30,
                },
                "livenessProbe": {
                    "exec": {"command": _all_ranks_alive(spec.processes_per_node, HEARTBEAT_TOLERANCE_S)},
                    "periodSeconds": 20,
                    "timeoutSeconds": 5,
                    "failureThreshold": 1,
                },
                "volumeMounts": [
                    {"name": "artifacts", "mountPath": ARTIFACTS_MOUNT},
                    {"name": "runtime", "mountPath": RUNTIME_DIR},
                    {"name": "shm", "mountPath": "/dev/shm"},
                ],
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }
        ],
        "volumes": [
            {"name": "artifacts", "persistentVolumeClaim": {"claimName": ARTIFACTS_CLAIM}},
            {"name": "runtime", "emptyDir": {}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},  # DataLoader workers
        ],
    }
    if spec.gpu:
        pod_spec["tolerations"] = [{**GPU_TAINT, "operator": "Equal"}]
    if spec.nodes > 1:
        pod_spec["subdomain"] = spec.service_name
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.nodes,
            "parallelism": spec.nodes,
            "backoffLimit": 2,
            "ttlSecondsAfterFinished": 86400,
            "podFailurePolicy": {
                "rules": [
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                    {
                        "action": "FailJob",
                        "onExitCodes": {"containerName": "train", "operator": "In", "values": NON_RETRIABLE_EXIT_CODES},
                    },
                ]
            },
            "template": {
                "metadata": {"labels": labels, "annotations": {DO_NOT_DISRUPT: "true"}},
                "spec": pod_spec,
            },
        },
    }
    objects = [job]
    if spec.nodes > 1:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": spec.service_name, "namespace": spec.namespace, "labels": labels},
                "spec": {
                    "clusterIP": "None",
                    "selector": {"batch.kubernetes.io/job-name": spec.name},
                    "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT}],
                    "publishNotReadyAddresses": True,
                },
            }
        )
    return objects


@dataclass(frozen=True)
class SmokeJobSpec:
    """The bundled smoke job: a training Job of the smoke image running `smoke_job.train`."""

    team: str
    image: str
    bucket: str
    region: str
    uid: int
    gid: int
    steps: int = 200
    nodes: int = 1
    processes_per_node: int = 1
    gpu: bool = False
    experiment: str = "smoke"
    heartbeat_interval: int = contract.HEARTBEAT_INTERVAL_S
    slow_rank_share: float = SLOW_RANK_SHARE
    shutdown_budget: int = 60
    workers: int = 2
    namespace: str = contract.TRAINING_NAMESPACE
    name_suffix: str = ""
    min_duration: float = 0.0  # seconds the run spans at least, so its run alarms arm

    @property
    def fingerprint(self) -> str:
        """A short hash of the Job's settings; `name_suffix` carries the image's identity."""
        settings = {k: v for k, v in asdict(self).items() if k not in ("image", "name_suffix")}
        return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]

    @property
    def name(self) -> str:
        return f"beacon-smoke-{self.fingerprint}{self.name_suffix}"

    @property
    def service_name(self) -> str:
        return self.training_job().service_name

    def training_job(self) -> TrainingJobSpec:
        return TrainingJobSpec(
            team=self.team,
            image=self.image,
            bucket=self.bucket,
            region=self.region,
            uid=self.uid,
            gid=self.gid,
            name=self.name,
            command=SMOKE_COMMAND,
            experiment=self.experiment,
            nodes=self.nodes,
            processes_per_node=self.processes_per_node,
            gpu=self.gpu,
            heartbeat_interval=self.heartbeat_interval,
            slow_rank_share=self.slow_rank_share,
            shutdown_budget=self.shutdown_budget,
            namespace=self.namespace,
            environment=(
                ("BEACON_STEPS", str(self.steps)),
                ("BEACON_WORKERS", str(self.workers)),
                ("BEACON_MIN_DURATION", f"{self.min_duration:g}"),
            ),
            app=SMOKE_APP,
        )


SMOKE_COMMAND = ("-m", "smoke_job.train")
SMOKE_APP = "beacon-smoke"


def smoke_job_spec(config: TeamConfig, *, image: str, bucket: str, region: str, name_suffix: str = "") -> SmokeJobSpec:
    """A team's smoke Job settings: the cluster stack and `beacon smoke` both build from here."""
    training = config.training
    return SmokeJobSpec(
        team=config.team,
        image=image,
        bucket=bucket,
        region=region,
        uid=training.uid,
        gid=training.gid,
        steps=training.smoke_steps,
        nodes=training.smoke_nodes,
        processes_per_node=training.smoke_processes_per_node,
        heartbeat_interval=config.monitoring.heartbeat_interval_seconds,
        slow_rank_share=config.monitoring.slow_rank_share,
        name_suffix=name_suffix,
        min_duration=contract.smoke_min_duration_s(config.monitoring.heartbeat_interval_seconds),
    )


def smoke_job(spec: SmokeJobSpec) -> list[dict[str, Any]]:
    """The smoke Job: the bundled smoke training as any team job is built."""
    return training_job(spec.training_job())


# --- the same job as a SageMaker training job ------------------------------------------------
# SageMaker syncs this directory to the checkpoint S3 URI while the job runs, and brings it back at the start
# of the run's next job (a rerun, `names.training_job_names`): on SageMaker it is the persistent volume the
# spool needs.
SAGEMAKER_VOLUME = "/opt/ml/checkpoints"
SAGEMAKER_VOLUME_KIND = contract.SAGEMAKER_VOLUME  # under the run prefix, beside what the job writes itself


@dataclass(frozen=True)
class SageMakerContainer:
    entrypoint: list[str]
    arguments: list[str]
    environment: dict[str, str]
    checkpoint_s3_uri: str
    output_s3_uri: str  # OutputDataConfig.S3OutputPath: SageMaker's own upload at the job's end
    checkpoint_local_path: str = SAGEMAKER_VOLUME


def sagemaker_container(spec: TrainingJobSpec | SmokeJobSpec) -> SageMakerContainer:
    """A training job's container, entry point and settings as a SageMaker training job runs them."""
    if isinstance(spec, SmokeJobSpec):
        spec = spec.training_job()
    run_prefix = contract.run_prefix(spec.experiment, spec.name)
    return SageMakerContainer(
        entrypoint=LAUNCH_COMMAND,
        arguments=_torchrun_args(spec, sagemaker=True),
        environment=_environment(spec, volume=SAGEMAKER_VOLUME, heartbeat_file="/tmp/beacon-heartbeat"),
        checkpoint_s3_uri=f"s3://{spec.bucket}/{run_prefix}{SAGEMAKER_VOLUME_KIND}/",
        output_s3_uri=f"s3://{spec.bucket}/{run_prefix}{contract.SAGEMAKER_OUTPUT}/",
    )
