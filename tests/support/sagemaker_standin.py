"""A stand-in for SageMaker's training instances, in front of moto: no SageMaker can run here.

moto stores a training job and at once reports it Completed, but never runs it. This proxy forwards
every SageMaker call to moto and, for what moto cannot do:
- CreateTrainingJob: records the request as sent, then runs the request's container entry point and
  arguments as a local process, with the request's environment, /opt/ml/checkpoints mapped to a
  directory, and credentials of the request's execution role (assumed through moto) in place of
  SageMaker's. It does not sync the checkpoint directory to S3 or download an image.
- DescribeTrainingJob: moto's answer, with the status of that local process (InProgress while it
  runs; Completed, or Failed with the exit code, after).
- StopTrainingJob (moto lacks it): SIGTERM to the process, as SageMaker sends.
- The container's output goes to CloudWatch Logs in moto (/aws/sagemaker/TrainingJobs, a stream
  per job) once the process ends, as SageMaker streams it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tests.support.synth import ROOT
from workloads import manifests

TARGET_PREFIX = "SageMaker."
LOG_GROUP = "/aws/sagemaker/TrainingJobs"


@dataclass
class LocalTrainingJob:
    request: dict[str, Any]
    process: subprocess.Popen[bytes]
    log_path: Path
    ship_logs: Callable[[LocalTrainingJob], None]
    stopped: bool = False
    logs_shipped: bool = False

    @property
    def status(self) -> tuple[str, str, str]:
        code = self.process.poll()
        if code is not None and not self.logs_shipped:
            self.ship_logs(self)  # SageMaker streams the container's output to CloudWatch Logs
            self.logs_shipped = True
        if code is None:
            return ("Stopping", "Stopping", "") if self.stopped else ("InProgress", "Training", "")
        if self.stopped:
            return "Stopped", "Stopped", ""
        if code == 0:
            return "Completed", "Completed", ""
        return "Failed", "Failed", f"AlgorithmError: the container exited with code {code}"


@dataclass
class SageMakerStandIn:
    upstream: str
    workdir: Path
    role_credentials: Callable[[str], dict[str, str]]
    endpoint_for_job: str
    logs: Any  # a CloudWatch Logs client of the embedded AWS
    jobs: dict[str, LocalTrainingJob] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None: ...

            def do_POST(self) -> None:
                standin.handle(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="sagemaker-standin")

    def start(self) -> SageMakerStandIn:
        self.thread.start()
        return self

    def stop(self) -> None:
        for job in self.jobs.values():
            if job.process.poll() is None:
                os.killpg(job.process.pid, signal.SIGKILL)
                job.process.wait()
        self.server.shutdown()
        self.server.server_close()

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        action = str(request.headers.get("X-Amz-Target", "")).removeprefix(TARGET_PREFIX)
        self.calls.append(action)
        params = json.loads(body or b"{}")
        if action == "StopTrainingJob":
            job = self.jobs[params["TrainingJobName"]]
            job.stopped = True
            os.killpg(job.process.pid, signal.SIGTERM)
            self.reply(request, 200, b"{}")
            return
        status, payload = self.forward(request, body)
        if status == 200 and action == "CreateTrainingJob":
            self.run_container(params)
        if status == 200 and action == "DescribeTrainingJob" and params["TrainingJobName"] in self.jobs:
            answer = json.loads(payload)
            primary, secondary, reason = self.jobs[params["TrainingJobName"]].status
            answer.update(TrainingJobStatus=primary, SecondaryStatus=secondary)
            if reason:
                answer["FailureReason"] = reason
            payload = json.dumps(answer).encode()
        self.reply(request, status, payload)

    def forward(self, request: BaseHTTPRequestHandler, body: bytes) -> tuple[int, bytes]:
        upstream = urlparse(self.upstream)
        connection = http.client.HTTPConnection(str(upstream.hostname), upstream.port, timeout=30)
        headers = {k: v for k, v in request.headers.items() if k.lower() != "connection"}  # Host is signed
        connection.request("POST", request.path, body=body, headers=headers)
        response = connection.getresponse()
        payload = response.read()
        connection.close()
        return response.status, payload

    @staticmethod
    def reply(request: BaseHTTPRequestHandler, status: int, payload: bytes) -> None:
        request.send_response(status)
        request.send_header("Content-Type", "application/x-amz-json-1.1")
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)

    def run_container(self, params: dict[str, Any]) -> None:
        name = params["TrainingJobName"]
        volume = self.workdir / name / "opt-ml-checkpoints"
        volume.mkdir(parents=True)
        spec = params["AlgorithmSpecification"]
        command = [
            sys.executable if part == "python" else part
            for part in [*spec["ContainerEntrypoint"], *spec.get("ContainerArguments", [])]
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BEACON_"))}
        env.update(
            {k: v.replace(manifests.SAGEMAKER_VOLUME, str(volume)) for k, v in params.get("Environment", {}).items()}
        )
        env["BEACON_HEARTBEAT_FILE"] = str(self.workdir / name / "heartbeat")
        credentials = self.role_credentials(params["RoleArn"])
        env.update(
            AWS_ENDPOINT_URL=self.endpoint_for_job,
            AWS_ACCESS_KEY_ID=credentials["aws_access_key_id"],
            AWS_SECRET_ACCESS_KEY=credentials["aws_secret_access_key"],
        )
        if credentials.get("aws_session_token"):
            env["AWS_SESSION_TOKEN"] = credentials["aws_session_token"]
        log_path = self.workdir / name / "container.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.jobs[name] = LocalTrainingJob(params, process, log_path, self.ship_logs)

    def ship_logs(self, job: LocalTrainingJob) -> None:
        group, stream = LOG_GROUP, f"{job.request['TrainingJobName']}/algo-1-{int(time.time())}"
        with contextlib.suppress(self.logs.exceptions.ResourceAlreadyExistsException):
            self.logs.create_log_group(logGroupName=group)
        self.logs.create_log_stream(logGroupName=group, logStreamName=stream)
        lines = job.log_path.read_text(errors="replace").splitlines() or ["(no output)"]
        now_ms = int(time.time() * 1000)
        events = [{"timestamp": now_ms, "message": line} for line in lines[-1000:]]
        self.logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=events)
