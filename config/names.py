"""The names a team's deployment derives from its team name: its stacks, its cluster and the Karpenter
node role. The stacks create them; the operator finds them by them."""

from __future__ import annotations

STACK_COMPONENTS = ("network", "artifacts", "cluster", "monitoring")


def stack_name(team: str, component: str) -> str:
    return f"beacon-{team}-{component}"


def cluster_name(team: str) -> str:
    return f"beacon-{team}"


def karpenter_node_role_name(team: str) -> str:
    """The Karpenter node role, named as upstream's template names it. A fixed name lets the artifacts
    stack (deployed first) name the role in its image repository's policy without a reference."""
    return f"KarpenterNodeRole-{cluster_name(team)}"


def reader_tag(team: str) -> str:
    """The principal tag (value `true`) that lets a role of the account take the team's reader role."""
    return f"beacon-reader-{team}"


def smoke_image_repository(team: str) -> str:
    """The repository `cdk deploy` publishes the bundled smoke image into (the cluster stack's image assets): the
    team's own, so the roles that run its jobs may pull it and no other team's may. A fixed name, because CDK's
    asset manifest names its destination before any stack exists."""
    return f"{cluster_name(team)}/smoke"


def cdk_image_publishing_role_name(qualifier: str, account: str, region: str) -> str:
    """The CDK bootstrap's role that `cdk deploy` pushes image assets with (`cdk bootstrap`'s default names)."""
    return f"cdk-{qualifier}-image-publishing-role-{account}-{region}"


TRAINING_JOB_NAME_LIMIT = 63  # SageMaker's TrainingJobName
SAGEMAKER_LOG_GROUP = "/aws/sagemaker/TrainingJobs"  # the account's, shared by every team: streams <job>/algo-<n>-<t>


CONTAINER_INSIGHTS_LOG_KINDS = ("application", "dataplane", "host", "performance")


def container_insights_log_groups(cluster: str) -> list[str]:
    """The groups a cluster's observability add-on (Container Insights) writes to, creating them itself."""
    return [f"/aws/containerinsights/{cluster}/{kind}" for kind in CONTAINER_INSIGHTS_LOG_KINDS]


def container_log_group(cluster: str) -> str:
    """Where a cluster's observability add-on (Container Insights) ships its containers' logs."""
    return container_insights_log_groups(cluster)[0]


def training_job_prefix(team: str) -> str:
    """Every SageMaker training job of this team starts with it, so the team's reader may describe its jobs and read
    their streams in the account-wide `/aws/sagemaker/TrainingJobs` group, and no other team's. `-run-` as in run
    alarm names: the team model refuses 'run' after a hyphen, so no team's prefix starts another's."""
    return f"{team}-run-"


# SageMaker never reuses a training job's name, and a run resumes under its own id: each rerun of a run on
# SageMaker is a job of its own, `<prefix><run>-R<n>`. Run ids are lowercase, so no run's first job is another's
# rerun; its checkpoint sync (the run's prefix) brings the earlier job's spool and checkpoints back.
RERUN_MARK = "-R"
MAX_RERUNS = 99


def training_job_name(team: str, run: str, rerun: int = 0) -> str:
    """The SageMaker training job of a run (`rerun` n > 0: its n-th rerun); ValueError when the two do not fit
    SageMaker's 63 characters with room for the reruns' mark."""
    room = TRAINING_JOB_NAME_LIMIT - len(training_job_prefix(team)) - len(f"{RERUN_MARK}{rerun}" if rerun else "")
    if len(run) > room:
        raise ValueError(f"run {run!r}: a SageMaker job of team {team!r} takes a run id of at most {room} characters")
    if not 0 <= rerun <= MAX_RERUNS:
        raise ValueError(f"run {run!r}: rerun {rerun} is not 0-{MAX_RERUNS}")
    return f"{training_job_prefix(team)}{run}{f'{RERUN_MARK}{rerun}' if rerun else ''}"


def training_job_names(team: str, run: str) -> list[str]:
    """A run's training jobs in the order they are made: its first, then each rerun's (a run id too long to leave
    room for the reruns' mark, from before there were reruns, has its first alone)."""
    first = training_job_name(team, run)
    room = TRAINING_JOB_NAME_LIMIT - len(first)
    reruns = [rerun for rerun in range(1, MAX_RERUNS + 1) if len(f"{RERUN_MARK}{rerun}") <= room]
    return [first, *(training_job_name(team, run, rerun) for rerun in reruns)]
