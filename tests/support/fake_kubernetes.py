"""A fake Kubernetes API server for the `beacon smoke --target eks` tests: no cluster can run here.

What is faked, and how far:
- The REST paths `beacon smoke` uses: namespaces, service accounts, volume claims, Jobs, Services,
  pods and pod logs, with the kubernetes client's JSON shapes.
- Authentication: every request needs an EKS bearer token (``k8s-aws-v1.`` + base64url of an STS
  GetCallerIdentity URL, presigned by the expected access key, with ``x-k8s-aws-id`` signed).
- A kubelet: each pod of a Job runs the pod's real init and train commands as local processes, with
  /artifacts and /var/run/beacon mapped to directories, and the writer role's credentials standing
  in for EKS Pod Identity. The startup probe's file (the heartbeat) decides Ready. Probes,
  securityContext, resources and scheduling are not simulated.
- The Job controller: Complete when every index succeeded; the podFailurePolicy's FailJob exit codes
  fail it at once; other failures retry up to backoffLimit.
- Seeded state, for the doctor: Jobs, pods, events and nodes given as the API would serve them (`seed`),
  with no kubelet behind them: a pod OOMKilled, Pending, pulling an image in vain, a node Karpenter
  interrupted. Events are listed per namespace with `involvedObject.*` field selectors; nodes are read by
  name (404 once gone).
- For `make destroy`'s drain: Jobs listed per namespace, and pods without a selector.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.support.synth import ROOT
from workloads import manifests

MAPPED_PATHS = {manifests.ARTIFACTS_MOUNT: "volume", manifests.RUNTIME_DIR: "runtime"}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "code": code,
        "message": message,
    }


@dataclass
class FakePod:
    name: str
    index: int
    log_path: Path
    runtime_dir: Path
    phase: str = "Pending"
    init_exit: int | None = None
    train_exit: int | None = None
    process: subprocess.Popen[bytes] | None = None
    started_at: str = ""

    probe: Any = None  # runs one of the container's probes, as the kubelet would; set by the API

    @property
    def ready(self) -> bool:
        return self.phase == "Running" and self.probe is not None and self.probe("startupProbe")

    def as_object(self, job: FakeJob) -> dict[str, Any]:
        image = job.container["image"]

        def container_status(name: str, exit_code: int | None, running: bool) -> dict[str, Any]:
            if exit_code is not None:
                state: dict[str, Any] = {
                    "terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
                }
            elif running:
                state = {"running": {"startedAt": self.started_at or now()}}
            else:
                state = {"waiting": {"reason": "PodInitializing"}}
            return {
                "name": name,
                "image": image,
                "imageID": "",
                "ready": running and self.ready,
                "restartCount": 0,
                "state": state,
            }

        scheduled = {"type": "PodScheduled", "status": "True"}
        if not job.schedulable:
            scheduled = {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.",
            }
        conditions = [
            scheduled,
            {"type": "Ready", "status": "True" if self.ready else "False"},
        ]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": job.namespace,
                "labels": {**job.labels, "batch.kubernetes.io/job-name": job.name},
            },
            "status": {
                "phase": self.phase,
                "conditions": conditions,
                "initContainerStatuses": [container_status("volume-check", self.init_exit, False)],
                "containerStatuses": [
                    container_status("train", self.train_exit, self.phase == "Running" and self.train_exit is None)
                ],
            },
        }


@dataclass
class FakeJob:
    manifest: dict[str, Any]
    pods: list[FakePod] = field(default_factory=list)
    condition: dict[str, Any] | None = None
    deleted: bool = False
    schedulable: bool = True

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.manifest["metadata"]["namespace"])

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.manifest["metadata"].get("labels", {}))

    @property
    def pod_spec(self) -> dict[str, Any]:
        return dict(self.manifest["spec"]["template"]["spec"])

    @property
    def container(self) -> dict[str, Any]:
        return dict(self.pod_spec["containers"][0])

    def as_object(self) -> dict[str, Any]:
        succeeded = sum(1 for p in self.pods if p.phase == "Succeeded")
        failed = sum(1 for p in self.pods if p.phase == "Failed")
        active = sum(1 for p in self.pods if p.phase in ("Pending", "Running"))
        status: dict[str, Any] = {"active": active, "succeeded": succeeded, "failed": failed, "startTime": now()}
        if self.condition:
            status["conditions"] = [self.condition]
        return {**self.manifest, "status": status}


class FakeKubernetes:
    def __init__(
        self,
        workdir: Path,
        *,
        cluster_name: str,
        access_key_id: str,
        pod_environment: dict[str, str],
        namespaces: dict[str, dict[str, list[str]]],
    ) -> None:
        self.workdir = workdir
        self.cluster_name = cluster_name
        self.access_key_id = access_key_id
        self.pod_environment = pod_environment
        self.namespaces = namespaces  # name -> {"serviceaccounts": [...], "persistentvolumeclaims": [...]}
        self.jobs: dict[tuple[str, str], FakeJob] = {}
        self.services: dict[tuple[str, str], dict[str, Any]] = {}
        self.created_services: list[dict[str, Any]] = []  # every Service as created, deleted or not
        self.requests: list[tuple[str, str]] = []
        self.refused: list[str] = []
        self.schedulable = True  # False: pods stay Pending, as with no node that fits
        self.seeded_jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.seeded_pods: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.nodes: dict[str, dict[str, Any]] = {}
        self.node_pools: dict[str, dict[str, Any]] = {}  # karpenter.sh/v1 NodePools, cluster-scoped
        self.forbidden: set[str] = set()  # path prefixes answered 403, as RBAC would
        self.lock = threading.RLock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None: ...

            def do_GET(self) -> None:
                fake.handle(self, "GET")

            def do_POST(self) -> None:
                fake.handle(self, "POST")

            def do_DELETE(self) -> None:
                fake.handle(self, "DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="fake-kubernetes")

    def start(self) -> FakeKubernetes:
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.lock:
            for job in self.jobs.values():
                self._terminate(job)
        self.server.shutdown()
        self.server.server_close()

    # --- authentication -------------------------------------------------------------------
    def token_problem(self, header: str | None) -> str | None:
        """Why a bearer token is not an EKS token for this cluster from the expected key, or None."""
        if not header or not header.startswith("Bearer k8s-aws-v1."):
            return "no EKS bearer token"
        encoded = header.removeprefix("Bearer k8s-aws-v1.")
        url = urlparse(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode())
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if not re.fullmatch(r"sts\.[a-z0-9-]+\.amazonaws\.com", url.hostname or ""):
            return f"token is not for STS: {url.hostname}"
        if query.get("Action") != "GetCallerIdentity":
            return "token does not presign GetCallerIdentity"
        if "x-k8s-aws-id" not in query.get("X-Amz-SignedHeaders", "").split(";"):
            return "x-k8s-aws-id (the cluster name) is not a signed header"
        if not query.get("X-Amz-Credential", "").startswith(f"{self.access_key_id}/"):
            return "token is not signed by the expected access key"
        if "X-Amz-Signature" not in query:
            return "token is not signed"
        return None

    def seed(
        self,
        *,
        job: dict[str, Any] | None = None,
        pods: Sequence[dict[str, Any]] = (),
        events: Sequence[dict[str, Any]] = (),
        nodes: Sequence[dict[str, Any]] = (),
        node_pools: Sequence[dict[str, Any]] = (),
    ) -> None:
        """Objects as the API serves them (with `status`), standing still: nothing runs them."""
        with self.lock:
            if job is not None:
                self.seeded_jobs[(job["metadata"]["namespace"], job["metadata"]["name"])] = job
            self.seeded_pods += list(pods)
            self.events += list(events)
            self.nodes.update({n["metadata"]["name"]: n for n in nodes})
            self.node_pools.update({n["metadata"]["name"]: n for n in node_pools})

    # --- HTTP -----------------------------------------------------------------------------
    def handle(self, request: BaseHTTPRequestHandler, method: str) -> None:
        url = urlparse(request.path)
        self.requests.append((method, url.path))
        length = int(request.headers.get("Content-Length") or 0)
        body = json.loads(request.rfile.read(length)) if length else None
        problem = self.token_problem(request.headers.get("Authorization"))
        payload: dict[str, Any] | str
        if problem:
            self.refused.append(problem)
            code, payload = 401, status_body(401, "Unauthorized", problem)
        elif any(url.path.startswith(prefix) for prefix in self.forbidden):
            code, payload = 403, status_body(403, "Forbidden", f"{method} {url.path} is forbidden")
        else:
            code, payload = self.route(method, url.path, parse_qs(url.query), body)
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        request.send_response(code)
        request.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, dict[str, Any] | str]:
        with self.lock:
            if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)", path):
                return self._namespace(m[1])
            if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/(serviceaccounts|persistentvolumeclaims)/([^/]+)", path):
                return self._namespaced_object(m[1], m[2], m[3])
            if m := re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/jobs", path):
                if method == "GET":
                    listed = [j.as_object() for (ns, _), j in self.jobs.items() if ns == m[1] and not j.deleted]
                    return 200, {"apiVersion": "batch/v1", "kind": "JobList", "metadata": {}, "items": listed}
                return self._create_job(m[1], body) if method == "POST" else (405, status_body(405, "Method", path))
            m = re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/jobs/([^/]+)", path)
            if m and method == "GET" and (m[1], m[2]) in self.seeded_jobs:
                return 200, self.seeded_jobs[(m[1], m[2])]
            if m := re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/jobs/([^/]+)(/status)?", path):
                job = self.jobs.get((m[1], m[2]))
                if job is None or job.deleted:
                    return 404, status_body(404, "NotFound", f'jobs.batch "{m[2]}" not found')
                if method == "DELETE":
                    self._terminate(job)
                    job.deleted = True
                    return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
                return 200, job.as_object()
            if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/services(?:/([^/]+))?", path):
                return self._service(method, m[1], m[2], body)
            if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", path):
                return self._pods(m[1], query.get("labelSelector", [""])[0])
            if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log", path):
                return self._log(m[1], m[2], query)
            if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/events", path):
                return self._events(m[1], query.get("fieldSelector", [""])[0])
            if m := re.fullmatch(r"/api/v1/nodes/([^/]+)", path):
                if m[1] not in self.nodes:
                    return 404, status_body(404, "NotFound", f'nodes "{m[1]}" not found')
                return 200, self.nodes[m[1]]
            if m := re.fullmatch(r"/apis/karpenter.sh/v1/nodepools/([^/]+)", path):
                if m[1] not in self.node_pools:
                    return 404, status_body(404, "NotFound", f'nodepools.karpenter.sh "{m[1]}" not found')
                return 200, self.node_pools[m[1]]
        return 404, status_body(404, "NotFound", f"the fake has no route for {method} {path}")

    def _namespace(self, name: str) -> tuple[int, dict[str, Any]]:
        if name not in self.namespaces:
            return 404, status_body(404, "NotFound", f'namespaces "{name}" not found')
        return 200, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}

    def _namespaced_object(self, ns: str, plural: str, name: str) -> tuple[int, dict[str, Any]]:
        if name not in self.namespaces.get(ns, {}).get(plural, []):
            return 404, status_body(404, "NotFound", f'{plural} "{name}" not found')
        kind = {"serviceaccounts": "ServiceAccount", "persistentvolumeclaims": "PersistentVolumeClaim"}[plural]
        return 200, {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": ns}}

    def _service(self, method: str, ns: str, name: str | None, body: Any) -> tuple[int, dict[str, Any]]:
        if method == "POST":
            self.services[(ns, body["metadata"]["name"])] = body
            self.created_services.append(body)
            return 201, body
        if method == "DELETE" and name and self.services.pop((ns, name), None) is not None:
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        return 404, status_body(404, "NotFound", f'services "{name}" not found')

    def _create_job(self, ns: str, manifest: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if ns not in self.namespaces:
            return 404, status_body(404, "NotFound", f'namespaces "{ns}" not found')
        key = (ns, manifest["metadata"]["name"])
        if key in self.jobs and not self.jobs[key].deleted:
            return 409, status_body(409, "AlreadyExists", f'jobs.batch "{key[1]}" already exists')
        job = FakeJob(manifest, schedulable=self.schedulable)
        self.jobs[key] = job
        for index in range(int(manifest["spec"].get("completions", 1))):
            self._start_pod(job, index)
        return 201, job.as_object()

    def _pods(self, ns: str, selector: str) -> tuple[int, dict[str, Any]]:
        wanted = dict(part.split("=", 1) for part in selector.split(",") if part)
        items = []
        for job in self.jobs.values():
            if job.namespace != ns or job.deleted:
                continue
            for pod in job.pods:
                obj = pod.as_object(job)
                if all(obj["metadata"]["labels"].get(k) == v for k, v in wanted.items()):
                    items.append(obj)
        for obj in self.seeded_pods:
            labels = obj["metadata"].get("labels", {})
            if obj["metadata"]["namespace"] == ns and all(labels.get(k) == v for k, v in wanted.items()):
                items.append(obj)
        return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}

    def _events(self, ns: str, selector: str) -> tuple[int, dict[str, Any]]:
        """An EventList; of field selectors, `involvedObject.<field>=<value>` (what the doctor asks)."""
        wanted = dict(part.split("=", 1) for part in selector.split(",") if part)
        items = []
        for event in self.events:
            involved = event.get("involvedObject", {})
            if event["metadata"]["namespace"] == ns and all(
                involved.get(k.removeprefix("involvedObject.")) == v for k, v in wanted.items()
            ):
                items.append(event)
        return 200, {"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": items}

    def _log(self, ns: str, name: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any] | str]:
        for job in self.jobs.values():
            for pod in job.pods:
                if pod.name == name and job.namespace == ns:
                    container = query.get("container", ["train"])[0]
                    path = pod.log_path.with_suffix(f".{container}.log")
                    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
                    tail = int(query.get("tailLines", ["0"])[0]) or len(lines)
                    return 200, "\n".join(lines[-tail:])
        return 404, status_body(404, "NotFound", f'pods "{name}" not found')

    # --- the kubelet and the Job controller -------------------------------------------------
    def _start_pod(self, job: FakeJob, index: int) -> None:
        name = f"{job.name}-{index}-{secrets.token_hex(3)}"
        pod_dir = self.workdir / name
        runtime = pod_dir / "runtime"
        runtime.mkdir(parents=True)
        pod = FakePod(name, index, pod_dir / "pod", runtime)
        pod.probe = lambda kind: self._probe(job, pod, kind)
        job.pods.append(pod)
        threading.Thread(target=self._run_pod, args=(job, pod), daemon=True, name=f"kubelet-{name}").start()

    def _mapped(self, value: str, pod: FakePod) -> str:
        for path, local in MAPPED_PATHS.items():
            target = self.workdir / local if local == "volume" else pod.runtime_dir
            value = value.replace(path, str(target))
        return value

    def _probe(self, job: FakeJob, pod: FakePod, kind: str) -> bool:
        """The container's own probe command, on this pod's paths: ready means what the kubelet means."""
        command = [self._mapped(part, pod) for part in job.container[kind]["exec"]["command"]]
        return subprocess.run(command, capture_output=True, check=False).returncode == 0

    def _environment(self, job: FakeJob, pod: FakePod) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BEACON_"))}
        # The downward API, filled in as the kubelet would: the pod's name and its node's.
        downward = {"metadata.name": pod.name, "spec.nodeName": f"fake-node-{pod.index}"}
        env.update(
            {
                e["name"]: self._mapped(e["value"], pod)
                if "value" in e
                else downward[e["valueFrom"]["fieldRef"]["fieldPath"]]
                for e in job.container.get("env", [])
            }
        )
        env.update(self.pod_environment)
        env["JOB_COMPLETION_INDEX"] = str(pod.index)
        return env

    def _run_pod(self, job: FakeJob, pod: FakePod) -> None:
        if not job.schedulable:
            return
        (self.workdir / "volume").mkdir(exist_ok=True)
        init = job.pod_spec["initContainers"][0]
        with pod.log_path.with_suffix(".volume-check.log").open("wb") as log:
            done = subprocess.run(
                [self._mapped(part, pod) for part in init["command"]], stdout=log, stderr=subprocess.STDOUT
            )
        pod.init_exit = done.returncode
        if done.returncode != 0:
            pod.phase = "Failed"
            self._pod_finished(job, pod, done.returncode)
            return
        container = job.container
        command = [sys.executable if part == "python" else part for part in container["command"]]
        args = [self._mapped(a.replace("$(JOB_COMPLETION_INDEX)", str(pod.index)), pod) for a in container["args"]]
        with self.lock:
            if job.deleted:
                return
            with pod.log_path.with_suffix(".train.log").open("wb") as log:
                pod.process = subprocess.Popen(
                    [*command, *args],
                    cwd=ROOT,
                    env=self._environment(job, pod),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            pod.phase, pod.started_at = "Running", now()
        code = pod.process.wait()
        with self.lock:
            pod.train_exit = code
            pod.phase = "Succeeded" if code == 0 else "Failed"
            self._pod_finished(job, pod, code)

    def _pod_finished(self, job: FakeJob, pod: FakePod, code: int) -> None:
        with self.lock:
            if job.deleted or job.condition:
                return
            spec = job.manifest["spec"]
            completions = int(spec.get("completions", 1))
            if sum(1 for p in job.pods if p.phase == "Succeeded") >= completions:
                job.condition = {
                    "type": "Complete",
                    "status": "True",
                    "reason": "Completed",
                    "lastTransitionTime": now(),
                }
                return
            if pod.phase != "Failed":
                return
            for rule in spec.get("podFailurePolicy", {}).get("rules", []):
                codes = rule.get("onExitCodes", {})
                if rule["action"] == "FailJob" and pod.train_exit is not None and code in codes.get("values", []):
                    job.condition = {
                        "type": "Failed",
                        "status": "True",
                        "reason": "PodFailurePolicy",
                        "message": f"Container train for pod {job.namespace}/{pod.name} failed with exit code "
                        f"{code} matching FailJob rule",
                        "lastTransitionTime": now(),
                    }
                    return
            failures = sum(1 for p in job.pods if p.phase == "Failed")
            if failures > int(spec.get("backoffLimit", 6)):
                job.condition = {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit",
                    "lastTransitionTime": now(),
                }
                return
            self._start_pod(job, pod.index)

    def _terminate(self, job: FakeJob) -> None:
        for pod in job.pods:
            if pod.process is not None and pod.process.poll() is None:
                os.killpg(pod.process.pid, signal.SIGTERM)
                try:
                    pod.process.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    os.killpg(pod.process.pid, signal.SIGKILL)
                    pod.process.wait()

    def running_processes(self) -> int:
        return sum(1 for job in self.jobs.values() for p in job.pods if p.process and p.process.poll() is None)

    def wait_idle(self, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while self.running_processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.running_processes() == 0
