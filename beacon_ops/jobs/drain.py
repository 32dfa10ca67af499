"""`make destroy`'s first step: stop what runs on the team's cluster before any stack goes.

A GPU job stops the destroy unless it is stopped first (see `beacon_ops.teardown`): this deletes the training
namespace's Jobs (their pods drain on SIGTERM) and waits a bounded time for the namespace to be empty, else says
in one line what still runs and how to end it. It lives with the jobs because it speaks to the cluster as they do.

    python -m beacon_ops.jobs.drain --team T [--kubernetes-url URL]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from beacon import contract
from botocore.exceptions import BotoCoreError, ClientError

from beacon_ops.aws_access import AccessError, describe_aws_error, open_session
from beacon_ops.jobs.eks import cluster_api
from beacon_ops.jobs.flow import JobError
from config import ConfigError, load_team, names

DRAIN_BOUND_S = 600.0  # a Job's pods drain within their shutdown budget (60 s by default)
DRAIN_POLL_S = 10.0


@dataclass
class StillRunning:
    pods: list[tuple[str, str]] = field(default_factory=list)  # (pod, node) in the training namespace

    def __bool__(self) -> bool:
        return bool(self.pods)

    def line(self, team: str, waited_s: float) -> str:
        namespace = contract.TRAINING_NAMESPACE
        held = ", ".join(f"{namespace}/{pod} (node {node or '-'})" for pod, node in self.pods)
        ends = " ".join(pod for pod, _ in self.pods)
        return (
            f"beacon destroy: still running after {waited_s:.0f} s: {held}; end them with `kubectl -n {namespace} "
            f"delete pod {ends} --grace-period=0 --force`, then `make destroy TEAM={team}` again"
        )


def drain_cluster(
    api: Any,
    *,
    bound_s: float = DRAIN_BOUND_S,
    poll_s: float = DRAIN_POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    show: Callable[[str], None] = print,
) -> StillRunning:
    """Delete the training namespace's Jobs (their pods get SIGTERM and drain within their budget), then wait until
    no pod of the namespace is left, `bound_s` at most: what still runs then. Only the namespace's objects are
    touched (an operator's edit rights there suffice); the stack's own deletion then removes the NodePools, whose
    nodes, no do-not-disrupt pod left on them, Karpenter terminates at once."""
    from kubernetes import client as k8s

    batch, core = k8s.BatchV1Api(api), k8s.CoreV1Api(api)
    namespace = contract.TRAINING_NAMESPACE
    jobs = [job.metadata.name for job in batch.list_namespaced_job(namespace).items]
    for job in jobs:
        batch.delete_namespaced_job(job, namespace, propagation_policy="Background")
    show(f"beacon destroy: stopping {len(jobs)} Job(s) in {namespace}; waiting for their pods to drain")
    started = clock()
    while True:
        pods = core.list_namespaced_pod(namespace).items
        running = StillRunning([(p.metadata.name, p.spec.node_name or "") for p in pods])
        if not running or clock() - started >= bound_s:
            return running
        sleep(poll_s)


def drain(team: str, *, kubernetes_url: str | None, bound_s: float = DRAIN_BOUND_S) -> int:
    """`drain --team T`: 0 once nothing runs in the training namespace (or the cluster stack is gone), 1 with the
    line naming what still does, 2 when the cluster cannot be reached or refuses."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    config = load_team(team)
    session = open_session(region_flag=None, team_region=config.region)
    stack = names.stack_name(team, "cluster")
    try:
        session.client("cloudformation").describe_stacks(StackName=stack)
    except ClientError as error:
        if "does not exist" in str(error):
            return 0  # nothing of the cluster is left to stop
        raise
    cluster = names.cluster_name(team)
    later = "(`DRAIN=off` destroys anyway: a GPU job still running holds its node up to 24 h and stops the destroy)"
    try:
        api = cluster_api(session, cluster, config.region, url_override=kubernetes_url)
        running = drain_cluster(api, bound_s=bound_s)
    except JobError as error:
        print(f"beacon destroy: {error} {later}", file=sys.stderr)
        return 2
    except ApiException as error:
        print(
            f"beacon destroy: the Kubernetes API of {cluster} answered {error.status} {error.reason} to stopping the "
            f"{contract.TRAINING_NAMESPACE} namespace's Jobs: run it as a role in cluster.operator_role_arns {later}",
            file=sys.stderr,
        )
        return 2
    except (HTTPError, OSError) as error:
        print(
            f"beacon destroy: cannot reach the Kubernetes API of {cluster} ({type(error).__name__}): run it from "
            f"inside the VPC or through the bastion's tunnel (`KUBERNETES_URL=https://localhost:8443`) {later}",
            file=sys.stderr,
        )
        return 2
    if running:
        print(running.line(team, bound_s), file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m beacon_ops.jobs.drain", description=__doc__.splitlines()[0])
    parser.add_argument("--team", required=True)
    parser.add_argument("--kubernetes-url", default=None, help="the cluster's API through a tunnel")
    args = parser.parse_args(argv)
    try:
        return drain(args.team, kubernetes_url=args.kubernetes_url or None)
    except ConfigError as error:
        for line in error.lines:
            print(f"beacon destroy: {line}", file=sys.stderr)
        return 2
    except (AccessError, ClientError, BotoCoreError) as error:
        detail = describe_aws_error(error) if isinstance(error, ClientError | BotoCoreError) else str(error)
        print(f"beacon destroy: {detail}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
