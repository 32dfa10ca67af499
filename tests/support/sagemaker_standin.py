"""A stand-in for SageMaker's training instances, in front of moto: no SageMaker can run here.

moto stores a training job and at once reports it Completed, but never runs it. This proxy forwards
every SageMaker call to moto and, for what moto cannot do:
- CreateTrainingJob: records the request as sent, then runs the request's container entry point and
  arguments as one local process per instance (InstanceCount), each with the request's environment, its
  own directory for /opt/ml/checkpoints (instances share no volume), its own resourceconfig.json
  (algo-1, algo-2, ...; BEACON_SAGEMAKER_RESOURCE_CONFIG), the rendezvous on 127.0.0.1 at a free port
  (BEACON_RENDEZVOUS_HOST/PORT: the algo-N names resolve only in SageMaker's network), and credentials
  of the request's execution role (assumed through moto) in place of SageMaker's. It does not sync the
  checkpoint directories to S3 or download an image.
- DescribeTrainingJob: moto's answer, with the status of those processes: InProgress while any runs;
  Completed when all exited 0; Failed with the first failing instance's exit code, once the others,
  sent SIGTERM as SageMaker stops a job whose instance failed, have ended.
- StopTrainingJob (moto lacks it): SIGTERM to every instance, as SageMaker sends.
- A CreateTrainingJob with a name already used is refused with ResourceInUse, as SageMaker refuses it.
- What SageMaker itself does with the execution role at the edges, as that role (IAM enforced), once the
  job's instances end: it writes each instance's output to CloudWatch Logs (/aws/sagemaker/TrainingJobs, a
  stream per instance, `<job>/algo-N-<time>`), publishes the job's MetricDefinitions parsed from it under the
  /aws/sagemaker/TrainingJobs namespace, and uploads `<S3OutputPath>/<job>/output/model.tar.gz` (a plain
  PutObject) and `output.tar.gz` (a multipart upload), SSE-KMS with the job's key and never a conditional
  header, through `service_endpoint` (the strict endpoint: the bucket policy's conditions apply). Any of
  them refused fails the job, as SageMaker fails it after training succeeded.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from tests.support.synth import ROOT
from workloads import manifests

TARGET_PREFIX = "SageMaker."
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
METRIC_NAMESPACE = "/aws/sagemaker/TrainingJobs"  # where SageMaker publishes a job's MetricDefinitions
REGION = "us-east-1"


@dataclass
class Instance:
    host: str  # algo-1, algo-2, ...
    process: subprocess.Popen[bytes]
    log_path: Path


@dataclass
class LocalTrainingJob:
    request: dict[str, Any]
    instances: list[Instance]
    finish: Callable[[LocalTrainingJob], str]  # SageMaker's work at the end; a failure's reason, or ""
    stopped: bool = False
    torn_down: bool = False
    finished: bool = False
    failure: str = ""

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """algo-1's process: the one a one-instance job has."""
        return self.instances[0].process

    def signal_all(self, signum: int) -> None:
        for instance in self.instances:
            if instance.process.poll() is None:
                os.killpg(instance.process.pid, signum)

    @property
    def status(self) -> tuple[str, str, str]:
        codes = [instance.process.poll() for instance in self.instances]
        failed = [(i, code) for i, code in zip(self.instances, codes, strict=True) if code not in (None, 0)]
        if failed and not self.stopped and not self.torn_down:
            self.signal_all(signal.SIGTERM)  # one instance failed: SageMaker stops the job's other instances
            self.torn_down = True
        if any(code is None for code in codes):
            return ("Stopping", "Stopping", "") if self.stopped else ("InProgress", "Training", "")
        if not self.finished:
            self.failure = self.finish(self)  # logs, metrics and the output upload, as the execution role
            self.finished = True
        if self.stopped:
            return "Stopped", "Stopped", ""
        if self.failure and not failed:
            return "Failed", "Failed", self.failure
        if not failed:
            return "Completed", "Completed", ""
        instance, code = failed[0]
        return "Failed", "Failed", f"AlgorithmError: the container on {instance.host} exited with code {code}"


@dataclass
class SageMakerStandIn:
    upstream: str
    workdir: Path
    role_credentials: Callable[[str], dict[str, str]]
    endpoint_for_job: str
    service_endpoint: str  # where SageMaker's own calls as the execution role go (the strict endpoint)
    ca_bundle: str | None = None  # the service endpoint's certificate authority, when it speaks https
    jobs: dict[str, LocalTrainingJob] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    uploads: list[tuple[str, str]] = field(default_factory=list)  # (how, key) of SageMaker's own uploads
    # Called with each instance's /opt/ml/checkpoints once made, before its container starts (a test's ownership)
    prepare_volume: Callable[[Path], None] | None = None

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
            job.signal_all(signal.SIGKILL)
            for instance in job.instances:
                instance.process.wait()
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
            job.signal_all(signal.SIGTERM)
            self.reply(request, 200, b"{}")
            return
        if action == "CreateTrainingJob" and params["TrainingJobName"] in self.jobs:  # moto would take it again
            message = (
                "Training job names must be unique within an AWS account and region, and a training job with this "
                f"name already exists ({params['TrainingJobName']})"
            )
            self.reply(request, 400, json.dumps({"__type": "ResourceInUse", "message": message}).encode())
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
        spec = params["AlgorithmSpecification"]
        command = [
            sys.executable if part == "python" else part
            for part in [*spec["ContainerEntrypoint"], *spec.get("ContainerArguments", [])]
        ]
        resources = params["ResourceConfig"]
        hosts = [f"algo-{n}" for n in range(1, int(resources.get("InstanceCount", 1)) + 1)]
        port = free_port()
        credentials = self.role_credentials(params["RoleArn"])
        instances = []
        for host in hosts:
            home = self.workdir / name / host
            volume = home / "opt-ml-checkpoints"
            volume.mkdir(parents=True)
            if self.prepare_volume is not None:
                self.prepare_volume(volume)
            resource_config = home / "resourceconfig.json"
            resource_config.write_text(
                json.dumps(
                    {
                        "current_host": host,
                        "current_instance_type": resources["InstanceType"],
                        "hosts": hosts,
                        "network_interface_name": "lo",
                    }
                )
            )
            env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BEACON_"))}
            env.update(
                {
                    k: v.replace(manifests.SAGEMAKER_VOLUME, str(volume))
                    for k, v in params.get("Environment", {}).items()
                }
            )
            env.update(
                BEACON_HEARTBEAT_FILE=str(home / "heartbeat"),
                BEACON_SAGEMAKER_RESOURCE_CONFIG=str(resource_config),
                BEACON_RENDEZVOUS_HOST="127.0.0.1",
                BEACON_RENDEZVOUS_PORT=str(port),
                AWS_ENDPOINT_URL=self.endpoint_for_job,
                AWS_ACCESS_KEY_ID=credentials["aws_access_key_id"],
                AWS_SECRET_ACCESS_KEY=credentials["aws_secret_access_key"],
            )
            if credentials.get("aws_session_token"):
                env["AWS_SESSION_TOKEN"] = credentials["aws_session_token"]
            log_path = home / "container.log"
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            instances.append(Instance(host, process, log_path))
        self.jobs[name] = LocalTrainingJob(params, instances, self.finish)

    def volume(self, job: str, host: str = "algo-1") -> Path:
        """An instance's /opt/ml/checkpoints."""
        return self.workdir / job / host / "opt-ml-checkpoints"

    def as_role(self, job: LocalTrainingJob, service: str) -> Any:
        """A client of `service` as the job's execution role, at SageMaker's service endpoint."""
        credentials = self.role_credentials(job.request["RoleArn"])
        return boto3.client(
            service, endpoint_url=self.service_endpoint, region_name=REGION, verify=self.ca_bundle, **credentials
        )

    def finish(self, job: LocalTrainingJob) -> str:
        """What SageMaker does once a job's containers ended, as the execution role; why it failed, or ""."""
        for step, action in (("logs", self.ship_logs), ("metrics", self.publish_metrics)):
            try:
                action(job)
            except (ClientError, BotoCoreError) as error:
                return f"ClientError: {step}: {error}"
        if job.stopped or any(instance.process.poll() != 0 for instance in job.instances):
            return ""  # a failed or stopped job's reason is its own
        try:
            self.upload_output(job)
        except (ClientError, BotoCoreError) as error:
            return f"ClientError: Artifact upload failed: {error}"
        return ""

    def ship_logs(self, job: LocalTrainingJob) -> None:
        logs = self.as_role(job, "logs")
        with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
            logs.create_log_group(logGroupName=LOG_GROUP)
        for instance in job.instances:
            stream = f"{job.request['TrainingJobName']}/{instance.host}-{int(time.time())}"
            logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
            # CloudWatch Logs refuses an empty event (its agent ships none); two ranks' interleaved output leaves some
            lines = [line for line in instance.log_path.read_text(errors="replace").splitlines() if line]
            lines = lines or ["(no output)"]
            now_ms = int(time.time() * 1000)
            events = [{"timestamp": now_ms, "message": line} for line in lines[-1000:]]
            logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream, logEvents=events)

    def publish_metrics(self, job: LocalTrainingJob) -> None:
        """The job's MetricDefinitions, each regex's last match in each instance's output."""
        definitions = job.request["AlgorithmSpecification"].get("MetricDefinitions", [])
        data = []
        for instance in job.instances:
            text = instance.log_path.read_text(errors="replace")
            for definition in definitions:
                found = re.findall(definition["Regex"], text)
                if found:
                    host = f"{job.request['TrainingJobName']}/{instance.host}"
                    data.append({"MetricName": definition["Name"], "Value": float(found[-1]),
                                 "Dimensions": [{"Name": "Host", "Value": host}]})  # fmt: skip
        if data:
            self.as_role(job, "cloudwatch").put_metric_data(Namespace=METRIC_NAMESPACE, MetricData=data)

    def upload_output(self, job: LocalTrainingJob) -> None:
        """model.tar.gz by a plain PutObject, output.tar.gz by a multipart upload: no If-None-Match on either."""
        destination = urlparse(job.request["OutputDataConfig"]["S3OutputPath"])
        bucket, prefix = destination.netloc, destination.path.lstrip("/")
        key_id = job.request["OutputDataConfig"].get("KmsKeyId")
        encryption = {"ServerSideEncryption": "aws:kms", **({"SSEKMSKeyId": key_id} if key_id else {})}
        s3 = self.as_role(job, "s3")
        base = f"{prefix}{job.request['TrainingJobName']}/output/"
        s3.put_object(Bucket=bucket, Key=f"{base}model.tar.gz", Body=tarball(self.home(job) / "model"), **encryption)
        self.uploads.append(("PutObject", f"{base}model.tar.gz"))
        upload = s3.create_multipart_upload(Bucket=bucket, Key=f"{base}output.tar.gz", **encryption)
        part = s3.upload_part(Bucket=bucket, Key=f"{base}output.tar.gz", UploadId=upload["UploadId"], PartNumber=1,
                              Body=tarball(self.home(job) / "output" / "data"))  # fmt: skip
        s3.complete_multipart_upload(
            Bucket=bucket, Key=f"{base}output.tar.gz", UploadId=upload["UploadId"],
            MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]},
        )  # fmt: skip
        self.uploads.append(("CompleteMultipartUpload", f"{base}output.tar.gz"))

    def home(self, job: LocalTrainingJob, host: str = "algo-1") -> Path:
        return self.workdir / str(job.request["TrainingJobName"]) / host


def tarball(directory: Path) -> bytes:
    """A directory as SageMaker packs /opt/ml/model or /opt/ml/output/data (empty when the job wrote nothing)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        if directory.is_dir():
            for path in sorted(directory.rglob("*")):
                archive.add(path, arcname=str(path.relative_to(directory)))
    return buffer.getvalue()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
