"""`--target eks` of `beacon smoke` and `beacon run`: a fresh Job on the team's cluster, through the Kubernetes API.

No kubectl: the kubernetes client, with a bearer token made as `aws eks get-token` makes it (an STS
GetCallerIdentity URL presigned with the cluster's name in a signed header).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import dataclasses
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import boto3
import urllib3
from botocore.exceptions import BotoCoreError, ClientError
from botocore.signers import RequestSigner
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from beacon_ops.evidence.reading import Delivery
from beacon_ops.jobs.flow import SHOW_EVERY_S, Access, JobError, JobReport, Show, TeamOutputs
from workloads import manifests

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_ID_HEADER = "x-k8s-aws-id"
TOKEN_REFRESH_S = 600  # EKS honours a token for 15 minutes
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
# Waiting reasons that no amount of waiting fixes.
HOPELESS_WAITING = frozenset({"InvalidImageName", "CreateContainerConfigError", "ErrImageNeverPull"})
LOG_TAIL_LINES = 200


def eks_token(session: boto3.session.Session, cluster_name: str, region: str) -> str:
    """What `aws eks get-token` prints: base64url of a presigned STS GetCallerIdentity URL."""
    credentials = session.get_credentials()
    if credentials is None:
        raise JobError("no AWS credentials: cannot make a token for the Kubernetes API")
    sts = session.client("sts", region_name=region)
    signer = RequestSigner(sts.meta.service_model.service_id, region, "sts", "v4", credentials, sts.meta.events)
    url = signer.generate_presigned_url(
        {
            "method": "GET",
            "url": f"https://sts.{region}.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15",
            "body": {},
            "headers": {CLUSTER_ID_HEADER: cluster_name},
            "context": {},
        },
        region_name=region,
        expires_in=60,
        operation_name="",
    )
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def kubernetes_api(session: boto3.session.Session, outputs: TeamOutputs, *, url_override: str | None) -> k8s.ApiClient:
    """An API client for the team's cluster; the endpoint comes from EKS unless a tunnel is given."""
    return cluster_api(session, outputs.cluster_name, outputs.region, url_override=url_override)


def cluster_api(
    session: boto3.session.Session, cluster_name: str, region: str, *, url_override: str | None
) -> k8s.ApiClient:
    """An API client for cluster `cluster_name`, authenticated with an EKS token of `session`."""
    try:
        cluster = session.client("eks").describe_cluster(name=cluster_name)["cluster"]
    except (ClientError, BotoCoreError) as error:
        raise JobError(f"cluster {cluster_name}: cannot describe it: {error}") from None
    if cluster.get("status") != "ACTIVE":
        raise JobError(f"cluster {cluster_name} is {cluster.get('status')}, not ACTIVE")
    endpoint = str(cluster["endpoint"])
    configuration = k8s.Configuration()
    configuration.host = url_override or endpoint
    if configuration.host.startswith("https://"):
        authority = base64.b64decode(cluster["certificateAuthority"]["data"])
        ca = tempfile.NamedTemporaryFile(prefix="beacon-eks-ca-", suffix=".crt", delete=False)  # noqa: SIM115
        with ca:
            ca.write(authority)
        atexit.register(os.unlink, ca.name)
        configuration.ssl_ca_cert = ca.name
        if url_override:  # a tunnel: the certificate still names the cluster's endpoint
            configuration.tls_server_name = urlparse(endpoint).hostname
    # The client sends a bearer token only once one is set; the hook renews it before it expires.
    configuration.api_key = {"authorization": eks_token(session, cluster_name, region)}
    minted = [time.monotonic()]

    def refresh(conf: k8s.Configuration) -> None:
        if time.monotonic() - minted[0] > TOKEN_REFRESH_S:
            conf.api_key["authorization"] = eks_token(session, cluster_name, region)
            minted[0] = time.monotonic()

    configuration.api_key_prefix = {"authorization": "Bearer"}
    configuration.refresh_api_key_hook = refresh
    return k8s.ApiClient(configuration)


def _refused(error: ApiException, what: str, cluster: str) -> JobError:
    if error.status in (401, 403):
        return JobError(
            f"the Kubernetes API of {cluster} refused {what} ({error.status} {error.reason}): list your role "
            "in cluster.operator_role_arns of the team file (an access entry on the cluster) and redeploy"
        )
    if error.status == 404:
        return JobError(f"{what} not found on cluster {cluster}: is the cluster stack deployed?")
    return JobError(f"{what} on cluster {cluster}: {error.status} {error.reason}")


@dataclass
class PodView:
    name: str
    phase: str
    ready: bool
    detail: str


def pod_views(pods: list[Any]) -> list[PodView]:
    views = []
    for pod in pods:
        status = pod.status
        conditions = {c.type: c for c in status.conditions or []}
        ready = bool(conditions.get("Ready") and conditions["Ready"].status == "True")
        detail = ""
        scheduled = conditions.get("PodScheduled")
        if scheduled is not None and scheduled.status == "False":
            detail = f"{scheduled.reason}: {scheduled.message or ''}".strip()
        for container in [*(status.init_container_statuses or []), *(status.container_statuses or [])]:
            waiting = container.state.waiting if container.state else None
            if waiting is not None and waiting.reason not in (None, "PodInitializing", "ContainerCreating"):
                detail = f"{container.name} {waiting.reason}: {waiting.message or ''}".strip()
            terminated = container.state.terminated if container.state else None
            if terminated is not None and terminated.exit_code:
                detail = f"{container.name} exited {terminated.exit_code} ({terminated.reason})"
        views.append(PodView(pod.metadata.name, str(status.phase), ready, detail))
    return views


@dataclass
class EksJob:
    outputs: TeamOutputs
    spec: manifests.TrainingJobSpec
    api: k8s.ApiClient
    poll_interval_s: float = 5.0

    @property
    def batch(self) -> k8s.BatchV1Api:
        return k8s.BatchV1Api(self.api)

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    def check_prerequisites(self) -> None:
        """What the stack put on the cluster for the Job: its namespace, account and volume claim."""
        ns, cluster = self.spec.namespace, self.outputs.cluster_name
        checks: list[tuple[str, Callable[[], Any]]] = [
            (f"namespace {ns}", lambda: self.core.read_namespace(ns)),
            (
                f"service account {ns}/{manifests.TRAINING_SERVICE_ACCOUNT}",
                lambda: self.core.read_namespaced_service_account(manifests.TRAINING_SERVICE_ACCOUNT, ns),
            ),
            (
                f"volume claim {ns}/{manifests.ARTIFACTS_CLAIM}",
                lambda: self.core.read_namespaced_persistent_volume_claim(manifests.ARTIFACTS_CLAIM, ns),
            ),
        ]
        for what, read in checks:
            try:
                read()
            except ApiException as error:
                raise _refused(error, what, cluster) from None
            except urllib3.exceptions.HTTPError as error:
                raise JobError(
                    f"cannot reach the Kubernetes API of {cluster} at {self.api.configuration.host} "
                    f"({type(error).__name__}): the endpoint is private; run inside the VPC or pass "
                    "--kubernetes-url through a tunnel"
                ) from None

    def create(self) -> list[dict[str, Any]]:
        objects = manifests.training_job(self.spec)
        for obj in objects:
            try:
                if obj["kind"] == "Job":
                    self.batch.create_namespaced_job(self.spec.namespace, obj)
                else:
                    self.core.create_namespaced_service(self.spec.namespace, obj)
            except ApiException as error:
                what = f"creating {obj['kind']} {obj['metadata']['name']}"
                raise _refused(error, what, self.outputs.cluster_name) from None
        return objects

    def pods(self) -> list[Any]:
        selector = f"{JOB_NAME_LABEL}={self.spec.name}"
        return list(self.core.list_namespaced_pod(self.spec.namespace, label_selector=selector).items)

    def wait(
        self, report: JobReport, delivery: Delivery, *, start_timeout_s: float, timeout_s: float, show: Show
    ) -> None:
        """Until the Job completes or fails, a pod hits a hopeless state, or a bound runs out."""
        started = time.monotonic()
        shown_at = 0.0
        seen_ready = False
        while True:
            try:
                job = self.batch.read_namespaced_job_status(self.spec.name, self.spec.namespace)
            except ApiException as error:
                raise _refused(
                    error, f"Job {self.spec.namespace}/{self.spec.name}", self.outputs.cluster_name
                ) from None
            conditions = {c.type: c for c in job.status.conditions or [] if c.status == "True"}
            views = pod_views(self.pods())
            seen_ready = seen_ready or any(v.ready or v.phase in ("Succeeded", "Failed") for v in views)
            elapsed = time.monotonic() - started
            if time.monotonic() - shown_at >= SHOW_EVERY_S or conditions:
                pods = ", ".join(f"{v.name} {v.phase}{' ready' if v.ready else ''}" for v in views) or "no pod yet"
                show(f"{pods} · {delivery.poll().describe()} · {elapsed:.0f} s")
                shown_at = time.monotonic()
            if "Complete" in conditions:
                report.platform_state, report.platform_succeeded = "Complete", True
                report.platform_detail = f"succeeded: {job.status.succeeded}, failed pods: {job.status.failed or 0}"
                return
            if "Failed" in conditions:
                failed = conditions["Failed"]
                report.platform_state = "Failed"
                report.platform_detail = f"{failed.reason}: {failed.message}"
                return
            hopeless = [v for v in views if any(reason in v.detail for reason in HOPELESS_WAITING)]
            if hopeless:
                report.platform_state = "NotStarted"
                report.platform_detail = f"{hopeless[0].name}: {hopeless[0].detail}"
                return
            if not seen_ready and elapsed > start_timeout_s:
                blocker = next((f"{v.name} {v.phase}: {v.detail}" for v in views if v.detail), "no pod was created")
                report.platform_state = "NotReady"
                report.platform_detail = f"no pod ready within {start_timeout_s:.0f} s ({blocker})"
                return
            if elapsed > timeout_s:
                report.platform_state, report.platform_detail = "TimedOut", f"not finished within {timeout_s:.0f} s"
                return
            time.sleep(self.poll_interval_s)

    def collect_logs(self, report: JobReport) -> None:
        containers = ["volume-check", "train"]
        for pod in self.pods():
            for container in containers:
                try:
                    report.logs[f"{pod.metadata.name}/{container}"] = str(
                        self.core.read_namespaced_pod_log(
                            pod.metadata.name, self.spec.namespace, container=container, tail_lines=LOG_TAIL_LINES
                        )
                    )
                except ApiException as error:
                    report.logs[f"{pod.metadata.name}/{container}"] = f"(no log: {error.status} {error.reason})"

    def delete(self, objects: list[dict[str, Any]]) -> None:
        for obj in objects:
            name = obj["metadata"]["name"]
            with contextlib.suppress(ApiException):
                if obj["kind"] == "Job":
                    self.batch.delete_namespaced_job(name, self.spec.namespace, propagation_policy="Background")
                else:
                    self.core.delete_namespaced_service(name, self.spec.namespace)


@dataclass(kw_only=True)
class EksTarget:
    """run_job's target: the job as a Kubernetes Job (and Service) in the stack's training namespace.

    Cleanup deletes the Job (its pods get SIGTERM and drain) unless `keep`; with `keep_ended`, a Job
    that ended (Complete or Failed, so its pods bill nothing) is left for its TTL, its pods' logs with
    it, and only one still running when the command stops following is deleted."""

    access: Access
    outputs: TeamOutputs
    kubernetes_url: str | None
    start_timeout_s: float
    timeout_s: float
    keep: bool
    keep_ended: bool = False
    poll_interval_s: float = 5.0
    name: str = "eks"
    _job: EksJob | None = None
    _objects: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def job(self) -> EksJob:
        assert self._job is not None, "launch() first"
        return self._job

    def launch(self, spec: manifests.TrainingJobSpec, report: JobReport, show: Show) -> None:
        spec = dataclasses.replace(spec, namespace=self.outputs.namespace)
        api = kubernetes_api(self.access.operator, self.outputs, url_override=self.kubernetes_url)
        job = EksJob(self.outputs, spec, api, self.poll_interval_s)
        job.check_prerequisites()
        report.launched = {
            "cluster": self.outputs.cluster_name,
            "api": api.configuration.host,
            "namespace": spec.namespace,
            "job": spec.name,
            "image": spec.image,
            "nodes": spec.nodes,
            "processes_per_node": spec.processes_per_node,
            "gpu": spec.gpu,
        }
        show(f"creating Job {spec.namespace}/{spec.name} on {self.outputs.cluster_name}")
        self._objects = job.create()
        self._job = job

    def wait(self, report: JobReport, delivery: Delivery, show: Show) -> None:
        self.job.wait(report, delivery, start_timeout_s=self.start_timeout_s, timeout_s=self.timeout_s, show=show)

    def collect_logs(self, report: JobReport) -> None:
        self.job.collect_logs(report)

    def cleanup(self, report: JobReport) -> None:
        if self.keep:
            return
        if self.keep_ended and report.platform_state in ("Complete", "Failed"):
            report.launched["left"] = "the Job ended: kept for its TTL with its pods' logs (kubectl logs)"
            return
        self.job.delete(self._objects)
        report.cleaned_up = True
