"""`beacon run`: a team's own job (its image, its command) as a training job on its stack.

The job is built like the smoke job (`workloads.manifests.TrainingJobSpec`, every safety setting), and
checked before anything is created: each problem is one line naming the option it came from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from beacon import contract
from botocore.exceptions import BotoCoreError, ClientError

from beacon_ops.jobs.flow import JobError, TeamOutputs, fresh_suffix
from config import TeamConfig, names
from workloads.manifests import JOB_NAME_LIMIT, TrainingJobSpec

# The distribution reference grammar (what `docker pull` accepts), with the registry required: the
# node pulls exactly what is named, never an implied docker.io.
_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_REGISTRY = rf"(?:{_LABEL}(?:\.{_LABEL})*(?::[0-9]+)?)"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_SUFFIX = rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?"
IMAGE_REFERENCE = re.compile(rf"(?P<registry>{_REGISTRY})/(?P<path>{_COMPONENT}(?:/{_COMPONENT})*){_SUFFIX}")
IN_TEAM_REPOSITORY = re.compile(_SUFFIX)
IMAGE_FORMS = ":TAG or @sha256:DIGEST (the team's ECR repository), or REGISTRY/REPOSITORY:TAG (or @sha256:DIGEST)"
# What torchrun runs is a script or a module, not an interpreter or a launcher: the container's
# command is already torchrun (`python -m beacon.launch`).
LAUNCHERS = ("python", "python3", "torchrun")
RUN_ID_LIMIT = JOB_NAME_LIMIT


def check_image(image: str) -> None:
    """The image option's form, before any stack is read."""
    short = image.startswith((":", "@")) and contract.whole_match(IN_TEAM_REPOSITORY, image)
    if short:
        return
    full = IMAGE_REFERENCE.fullmatch(image)
    # As docker reads it, a first part without "." or ":" (and not localhost) is a path on docker.io.
    registry = full["registry"] if full else ""
    if not (full and ("." in registry or ":" in registry or registry == "localhost")):
        raise JobError(f"--image: {image!r} is not an image reference naming its registry; give {IMAGE_FORMS}")
    if full["tag"] is None and full["digest"] is None:
        raise JobError(f"--image: {image!r} is not an image reference with a tag or digest; give {IMAGE_FORMS}")


def resolve_image(image: str, outputs: TeamOutputs) -> str:
    """A short form names the team's own repository (the artifacts stack's output)."""
    return f"{outputs.image_repository_uri}{image}" if image.startswith((":", "@")) else image


def in_team_repository(image: str, outputs: TeamOutputs) -> bool:
    return image.startswith((f"{outputs.image_repository_uri}:", f"{outputs.image_repository_uri}@"))


@dataclass(frozen=True)
class TeamJobRequest:
    """What `beacon run` was asked for, as given on its command line."""

    image: str
    command: tuple[str, ...]
    nodes: int = 1
    gpus_per_node: int = 0
    target: str = "eks"
    experiment: str = "default"
    run: str | None = None
    environment: tuple[tuple[str, str], ...] = ()


def default_run(experiment: str, *, limit: int = RUN_ID_LIMIT) -> str:
    """A fresh run id (and Job name): the experiment, cut to fit, and the time."""
    suffix = fresh_suffix()
    return f"{experiment[: limit - len(suffix)].rstrip('-')}{suffix}"


def run_id_limit(team: str, target: str) -> int:
    """How long a run id may be: a Kubernetes Job's name, or what the team's prefix leaves of SageMaker's."""
    if target != "sagemaker":
        return RUN_ID_LIMIT
    reruns = len(f"{names.RERUN_MARK}{names.MAX_RERUNS}")
    return min(RUN_ID_LIMIT, names.TRAINING_JOB_NAME_LIMIT - len(names.training_job_prefix(team)) - reruns)


def instance_gpus(ec2: Any, sagemaker_instance_type: str) -> int | None:
    """The GPUs of a SageMaker ML instance type, as EC2 describes its instance type (ml.g5.12xlarge: g5.12xlarge,
    4); None when EC2 does not know the type or may not be asked."""
    try:
        found = ec2.describe_instance_types(InstanceTypes=[sagemaker_instance_type.removeprefix("ml.")])
    except (ClientError, BotoCoreError):
        return None
    types = found.get("InstanceTypes") or []
    return sum(int(g.get("Count", 0)) for g in (types[0].get("GpuInfo") or {}).get("Gpus", [])) if types else None


def check_sagemaker_gpus(request: TeamJobRequest, config: TeamConfig, gpus: int | None) -> None:
    """One rank per GPU on SageMaker: --gpus-per-node must be the instance type's GPUs (`gpus`, from
    `instance_gpus`; None: not known, not checked)."""
    kind = config.training.sagemaker_instance_type
    if request.target != "sagemaker" or gpus is None or request.gpus_per_node == gpus:
        return
    if gpus == 0:
        raise JobError(
            f"--gpus-per-node: {request.gpus_per_node}, but training.sagemaker_instance_type {kind} has no GPU: "
            "give 0 (one rank on its CPUs), or set a GPU instance type in the team file"
        )
    raise JobError(
        f"--gpus-per-node: {request.gpus_per_node}, but training.sagemaker_instance_type {kind} has {gpus} GPU(s): "
        f"give {gpus} (one rank per GPU), or set the instance type in the team file"
    )


def check_request(request: TeamJobRequest, config: TeamConfig) -> None:
    """Each bad setting is a JobError naming its option; nothing is read or created before this."""
    if not request.command:
        raise JobError("CMD: empty; give the script or module after --, e.g. `-- train.py --epochs 3`")
    if request.command[0] in LAUNCHERS:
        raise JobError(
            f"CMD: starts with {request.command[0]!r}, but the container's command is torchrun already "
            "(python -m beacon.launch); give the script (`train.py ARGS`) or the module (`-m pkg.train ARGS`)"
        )
    if request.nodes < 1:
        raise JobError(f"--nodes: must be >= 1, got {request.nodes}")
    if request.gpus_per_node < 0:
        raise JobError(f"--gpus-per-node: must be >= 0, got {request.gpus_per_node}")
    limit = config.compute.gpu_limit  # the EKS GPU pool's; SageMaker's instances are checked against EC2
    if request.target == "eks" and request.gpus_per_node > limit:
        raise JobError(
            f"--gpus-per-node: {request.gpus_per_node} is more than the GPU pool's cap, compute.gpu_limit = {limit}"
        )
    if request.target == "eks" and request.nodes * request.gpus_per_node > limit:
        raise JobError(
            f"--nodes: {request.nodes} nodes of {request.gpus_per_node} GPUs is more than the GPU pool's cap, "
            f"compute.gpu_limit = {limit}: the last pods would never be scheduled"
        )
    check_image(request.image)
    for kind, value in (("experiment", request.experiment), ("run", request.run)):
        if value is not None and not contract.is_id(value):
            raise JobError(f"--{kind}: {value!r} must be 1-63 of a-z, 0-9 and '-', starting with a letter or digit")
    if request.run is not None and len(request.run) > RUN_ID_LIMIT:
        raise JobError(f"--run: {request.run!r} is {len(request.run)} characters; a Job name takes {RUN_ID_LIMIT}")
    if request.run is not None and request.target == "sagemaker":
        try:
            names.training_job_name(config.team, request.run, names.MAX_RERUNS)  # with room for its reruns
        except ValueError as error:
            raise JobError(f"--run: {error}") from None


def team_job(request: TeamJobRequest, config: TeamConfig, outputs: TeamOutputs) -> TrainingJobSpec:
    """The team's job as a training job of its stack: the smoke job's safety settings, its image and command."""
    return TrainingJobSpec(
        team=config.team,
        image=resolve_image(request.image, outputs),
        bucket=outputs.bucket,
        region=outputs.region,
        uid=config.training.uid,
        gid=config.training.gid,
        name=request.run or default_run(request.experiment, limit=run_id_limit(config.team, request.target)),
        command=request.command,
        experiment=request.experiment,
        nodes=request.nodes,
        processes_per_node=max(1, request.gpus_per_node),  # one rank per GPU; one on a CPU node
        gpu=request.gpus_per_node > 0,
        heartbeat_interval=config.monitoring.heartbeat_interval_seconds,
        slow_rank_share=config.monitoring.slow_rank_share,
        namespace=outputs.namespace,
        environment=request.environment,
    )
