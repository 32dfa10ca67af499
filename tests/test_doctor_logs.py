"""`beacon doctor` reads the job's container logs (issue 16): one test per verdict.

The logs are put into moto's CloudWatch Logs as the observability add-on (Container Insights: Fluent Bit's JSON,
streams named after node, pod, namespace and container) and SageMaker (plain lines, streams
`<training job>/algo-<n>-<epoch>`) write them, with their own timestamps. EKS jobs' state comes from the fake
Kubernetes API, seeded as in tests/test_doctor_orchestrator.py. The doctor reads as the team's reader role, whose
policy the moto provisioning takes from the synthesized template (actions only: tests/test_policies_as_aws_evaluates.py
proves the resources as AWS would evaluate them).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from botocore.stub import Stubber

from beacon_ops.doctor.diagnosis import DoctorInputs, diagnose, diagnose_job
from beacon_ops.doctor.log_reader import eks_job_logs, read_log_verdicts, sagemaker_job_logs
from beacon_ops.doctor.sagemaker_state import read_training_job
from config import names
from tests.support.deployed_team import BUCKET, TEAM, DeployedTeam
from tests.support.fake_kubernetes import FakeKubernetes
from tests.test_doctor_orchestrator import (
    GPU_NODE,
    NS,
    SPOT_MESSAGE,
    T0,
    answered,
    beacon_job,
    doctor,
    event,
    first_line,
    foreign_job,
    pod,
    put_heartbeats,
)

NODE = "ip-10-0-2-7.ec2.internal"
FAILED = {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": "2026-12-01T10:00:00Z"}}
REFUSED = "ConnectionRefusedError: [Errno 111] Connection refused"
DENIED = (
    "botocore.exceptions.ClientError: An error occurred (AccessDenied) when calling the PutObject operation: "
    "User: arn:aws:sts::123456789012:assumed-role/node/i-0abc is not authorized to perform: s3:PutObject"
)


def stream_of(pod_name: str, container: str = "train") -> str:
    return f"{NODE}-application.var.log.containers.{pod_name}_{NS}_{container}-0123456789abcdef.log"


def fluent_bit(text: str, pod_name: str, job: str = "") -> str:
    kubernetes: dict[str, Any] = {"pod_name": pod_name, "namespace_name": NS, "container_name": "train", "host": NODE}
    if job:
        kubernetes["labels"] = {"batch.kubernetes.io/job-name": job, "app": job}
    return json.dumps({"log": f"{text}\n", "stream": "stderr", "kubernetes": kubernetes})


def put_lines(deployed: DeployedTeam, group: str, stream: str, lines: list[tuple[float, str]]) -> int:
    """`lines` as (seconds after the container started, message); returns the start, in ms."""
    logs = deployed.client("logs")
    if not logs.describe_log_groups(logGroupNamePrefix=group)["logGroups"]:
        logs.create_log_group(logGroupName=group)
    logs.create_log_stream(logGroupName=group, logStreamName=stream)
    started_ms = int(time.time() * 1000) - 600_000
    events = [{"timestamp": started_ms + int(at * 1000), "message": message} for at, message in lines]
    logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=events)
    return started_ms


def at_utc(ms: int) -> str:
    return f"{datetime.fromtimestamp(ms / 1000, UTC):%Y-%m-%d %H:%M:%S} UTC"


CLUSTER_LOGS = names.container_log_group(names.cluster_name(TEAM))


def failed_foreign_job(kubernetes: FakeKubernetes, name: str, suffix: str) -> str:
    """A team's own Job whose one pod exited 1; the pod's name."""
    job = foreign_job(name, active=0, failed=1)
    kubernetes.seed(job=job, pods=[pod(job, suffix, phase="Failed", state=FAILED)])
    return f"{name}-{suffix}"


def test_a_foreign_job_refused_a_connection_at_start_and_the_first_line_quotes_it(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """The Job says only "Error, exit code 1"; its log's first seconds say why, and lead."""
    pod_name = failed_foreign_job(kubernetes, "fetch-train", "q1w2e")
    # Other jobs' pods in the same group, with failures of their own: not this job's. The first's name would pass
    # for this Indexed Job's pod 2; its labels say otherwise.
    other = "fetch-train-2-a1s2d"
    put_lines(deployed, CLUSTER_LOGS, stream_of(other), [(1, fluent_bit(DENIED, other, job="fetch-train-2"))])
    put_lines(deployed, CLUSTER_LOGS, stream_of("fetch-trainer-z0x9c"), [(1, f"{DENIED} (fetch-train)")])
    started = put_lines(
        deployed,
        CLUSTER_LOGS,
        stream_of(pod_name),
        [(0, fluent_bit("loading data from http://10.0.3.4:9000", pod_name)), (3, fluent_bit(REFUSED, pod_name))],
    )
    done = doctor(deployed, kubernetes, "--job", "fetch-train")
    assert done.returncode == 1, done.stdout + done.stderr
    assert first_line(done) == (
        f'connection-refused-at-start: pod {pod_name}, container train: "{REFUSED}" at {at_utc(started + 3000)}, '
        "3 s after its container started"
    )
    answer = answered(deployed, kubernetes, "--job", "fetch-train")
    logs = [v for v in answer["verdicts"] if v["check"] == "logs"]
    assert [v["verdict"] for v in logs] == ["connection-refused-at-start"]  # the other job's AccessDenied is not
    assert "MASTER_ADDR" in logs[0]["fix"] and answer["verdicts"][0]["verdict"] == "exit-code"


def test_a_beacon_run_denied_access_at_start_leads_with_the_denied_call(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """A Beacon run's Job whose container's first seconds were refused by S3, in plain (non-JSON) lines: the
    pod comes from the stream's name. The run's own evidence says only that it never started."""
    job = beacon_job("denied-run", active=0, failed=1)
    pod_name = "denied-run-0-z9x8c"
    kubernetes.seed(job=job, pods=[pod(job, "0-z9x8c", phase="Failed", state=FAILED)])
    started = put_lines(
        deployed, CLUSTER_LOGS, stream_of(pod_name), [(0, "beacon: preflight"), (2, DENIED), (40, "exiting")]
    )
    answer = answered(deployed, kubernetes, "--run", "denied-run")
    assert answer["diagnosis"] == "access-denied-at-start" and answer["lead"] == "logs"
    assert answer["headline"].startswith(
        f'access-denied-at-start: pod {pod_name}, container train: "botocore.exceptions.ClientError: An error '
        f"occurred (AccessDenied) when calling the PutObject operation"
    )
    assert f"at {at_utc(started + 2000)}, 2 s after its container started" in answer["headline"]
    checks = [v["check"] for v in answer["verdicts"]]
    assert checks[:3] == ["orchestrator", "logs", "job"] and "delivery" in checks
    assert "Pod Identity" in answer["verdicts"][1]["fix"]


def test_a_refused_connection_after_the_first_20_s_is_not_called_a_start_failure(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """25 s in, then 30 lines of training: the Job's exit code leads, the log finds nothing it knows."""
    pod_name = failed_foreign_job(kubernetes, "late-job", "p0o9i")
    lines = [(0.0, "start"), (25.0, REFUSED), *((26.0 + i, f"step {i} loss 0.5") for i in range(30))]
    put_lines(deployed, CLUSTER_LOGS, stream_of(pod_name), [(at, fluent_bit(text, pod_name)) for at, text in lines])
    answer = answered(deployed, kubernetes, "--job", "late-job")
    assert answer["diagnosis"] == "exit-code" and answer["lead"] == "orchestrator"
    [logs] = [v for v in answer["verdicts"] if v["check"] == "logs"]
    assert logs["status"] == "ok" and logs["verdict"] == "nothing known" and "32 line(s)" in logs["evidence"]


NCCL_AT_GAP = "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited"


def test_the_lines_at_the_gap_are_read_however_long_the_log_runs_on_after_it(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """Heartbeats until 120 s in; the NCCL error at 121 s; then 300 lines of waiting before the container ends.
    Neither the first 20 s nor the stream's last 20 lines hold it: the page read from the gap (the last
    heartbeat, less one beat: GetLogEvents with startTime) does, and the first line quotes it."""
    job = beacon_job("gap-run", active=0, failed=1)
    pod_name = "gap-run-0-g4p7q"
    kubernetes.seed(job=job, pods=[pod(job, "0-g4p7q", phase="Failed", state=FAILED)])
    lines = [(0.0, "beacon: preflight passed"), *((1.0 + i, f"step {i} loss 0.5") for i in range(100))]
    lines += [(121.0, NCCL_AT_GAP), *((130.0 + i, "waiting for the others to exit") for i in range(300))]
    started = put_lines(deployed, CLUSTER_LOGS, stream_of(pod_name), lines)
    put_heartbeats(deployed, "gap-run", [datetime.fromtimestamp(started / 1000 + s, UTC) for s in range(15, 121, 15)])
    answer = answered(deployed, kubernetes, "--run", "gap-run")
    assert answer["diagnosis"] == "nccl-at-gap" and answer["lead"] == "logs", answer["headline"]
    assert answer["headline"] == (
        f'nccl-at-gap: pod {pod_name}, container train: "{NCCL_AT_GAP}" at {at_utc(started + 121_000)}, '
        "121 s after its container started"
    )
    as_foreign = read_log_verdicts(
        deployed.client("logs"), eks_job_logs(group=CLUSTER_LOGS, job_name="gap-run", since=None)
    )
    assert [v.verdict for v in as_foreign] == ["nothing known"], "no gap known: the head and the tail alone"


def test_a_job_that_resumed_after_losing_its_node_is_not_blamed_on_its_rendezvous_retries(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """Spot took the node; the Job's retry runs on a new one, and its first seconds log torchrun's routine
    "Connection refused" while rank 0 comes up. The orchestrator's resumed verdict leads; the line is a warning."""
    job = foreign_job("resumed-job", active=1)
    gone, now_running = "resumed-job-0-aaaaa", "resumed-job-0-ccccc"
    events = [
        event("Pod", gone, "Scheduled", f"Successfully assigned {NS}/{gone} to {GPU_NODE}", T0,
              source="default-scheduler", kind_type="Normal"),
        event("Node", GPU_NODE, "SpotInterrupted", SPOT_MESSAGE, "2026-12-01T10:05:00Z", source="karpenter"),
    ]  # fmt: skip
    running = pod(job, "0-ccccc", phase="Running", state={"running": {"startedAt": "2026-12-01T10:08:00Z"}})
    kubernetes.seed(job=job, pods=[running], events=events)
    lines = [(0.0, "torchrun: waiting for rank 0"), (1.0, REFUSED), (3.0, "step 0 loss 2.3")]
    put_lines(deployed, CLUSTER_LOGS, stream_of(now_running), [(at, fluent_bit(t, now_running)) for at, t in lines])
    answer = answered(deployed, kubernetes, "--job", "resumed-job")
    assert answer["lead"] == "orchestrator" and answer["diagnosis"] == "spot-interrupted-resumed", answer["headline"]
    [refused] = [v for v in answer["verdicts"] if v["check"] == "logs"]
    assert refused["status"] == "warn" and refused["verdict"] == "connection-refused-at-start"


class BusyGroup:
    """A Container Insights group too busy for the searches: its newest streams and a FilterLogEvents over it
    bring nothing of the job. Only a stream asked for by its exact prefix answers."""

    def __init__(self, stream: str, lines: list[str]) -> None:
        self.stream, self.lines = stream, lines
        self.prefixes: list[str] = []

    def describe_log_streams(self, **asked: Any) -> dict[str, Any]:
        prefix = asked.get("logStreamNamePrefix")
        if prefix is None:
            return {"logStreams": [{"logStreamName": f"{NODE}-application.var.log.containers.other-{i}_x_y-0a.log"}
                                   for i in range(50)], "nextToken": "more"}  # fmt: skip
        self.prefixes.append(prefix)
        return {"logStreams": [{"logStreamName": self.stream}] if self.stream.startswith(prefix) else []}

    def filter_log_events(self, **_: Any) -> dict[str, Any]:
        return {"events": [], "nextToken": "more"}

    def get_log_events(self, **_: Any) -> dict[str, Any]:
        return {"events": [{"timestamp": 1_764_583_200_000 + i * 1000, "message": m} for i, m in enumerate(self.lines)]}


def test_a_pods_stream_is_found_by_its_exact_prefix_when_its_node_is_known() -> None:
    pod_name = "busy-job-0-q1w2e"
    group = BusyGroup(stream_of(pod_name), ["starting", DENIED])
    where = eks_job_logs(group=CLUSTER_LOGS, job_name="busy-job", since=None, pods=frozenset({pod_name}),
                         placed={pod_name: NODE}, namespace=NS)  # fmt: skip
    [verdict] = read_log_verdicts(group, where)
    assert group.prefixes == [f"{NODE}-application.var.log.containers.{pod_name}_{NS}_"]
    assert verdict.verdict == "access-denied-at-start" and pod_name in verdict.evidence
    unplaced = eks_job_logs(group=CLUSTER_LOGS, job_name="busy-job", since=None, pods=frozenset({pod_name}))
    assert [v.verdict for v in read_log_verdicts(BusyGroup(stream_of(pod_name), [DENIED]), unplaced)] == [
        "no log lines"
    ], "without its node, the searches alone: they find nothing in so busy a group"


class EmptyPagesFirst(BusyGroup):
    """GetLogEvents as CloudWatch may answer it: an empty page and a token to go on from, before the events."""

    def __init__(self, stream: str, lines: list[str]) -> None:
        super().__init__(stream, lines)
        self.asked: list[str | None] = []

    def get_log_events(self, **asked: Any) -> dict[str, Any]:
        self.asked.append(asked.get("nextToken"))
        if asked.get("nextToken") is None:
            return {"events": [], "nextForwardToken": "f/1", "nextBackwardToken": "b/1"}
        return super().get_log_events(**asked)


def test_an_empty_page_with_a_token_is_followed_to_the_events() -> None:
    pod_name = "empty-job-0-e1m2p"
    group = EmptyPagesFirst(stream_of(pod_name), ["starting", DENIED])
    where = eks_job_logs(group=CLUSTER_LOGS, job_name="empty-job", since=None, pods=frozenset({pod_name}),
                         placed={pod_name: NODE}, namespace=NS)  # fmt: skip
    [verdict] = read_log_verdicts(group, where)
    assert verdict.verdict == "access-denied-at-start", verdict
    assert group.asked == [None, "f/1", None, "b/1"], "head and tail: each followed once past its empty page"


def test_a_reader_without_log_access_gets_an_info_verdict_saying_how_to_read_them(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """No log group at all (the add-on never shipped a line): INFO, the job's own verdict still leads."""
    failed_foreign_job(kubernetes, "quiet-job", "a1b2c")
    answer = answered(deployed, kubernetes, "--job", "quiet-job")
    [logs] = [v for v in answer["verdicts"] if v["check"] == "logs"]
    assert logs["status"] == "info" and logs["verdict"] == "unreadable"
    assert "ResourceNotFoundException" in logs["evidence"] and "amazon-cloudwatch-observability" in logs["fix"]
    assert answer["lead"] == "orchestrator"


def put_training_job_lines(deployed: DeployedTeam, name: str, lines: list[tuple[float, str]]) -> int:
    """As SageMaker writes a job's first instance: a stream `<job>/algo-1-<epoch>` in the account's group."""
    return put_lines(deployed, names.SAGEMAKER_LOG_GROUP, f"{name}/algo-1-1764583200", lines)


def describe_failed(name: str) -> dict[str, Any]:
    t = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    return {
        "TrainingJobName": name,
        "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{name}",
        "TrainingJobStatus": "Failed",
        "SecondaryStatus": "Failed",
        "FailureReason": 'AlgorithmError: ExecuteUserScriptError: Command "python train.py" exit status 1',
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "SecondaryStatusTransitions": [
            {"Status": "Starting", "StartTime": t, "StatusMessage": "Preparing the instances for training"},
            {
                "Status": "Training",
                "StartTime": t.replace(minute=4),
                "StatusMessage": "Training image download completed.",
            },
            {"Status": "Failed", "StartTime": t.replace(minute=5), "StatusMessage": "Training job failed"},
        ],
        "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "RoleArn": "arn:aws:iam::123456789012:role/writer",
        "ModelArtifacts": {"S3ModelArtifacts": ""},
        "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
        "CreationTime": t,
        "TrainingEndTime": t.replace(minute=5),
    }


def test_a_failed_sagemaker_job_quotes_its_failure_reason_first_and_its_logs_follow(deployed: DeployedTeam) -> None:
    """moto's SageMaker keeps no FailureReason of its own (a created job never fails), so DescribeTrainingJob is
    stubbed with botocore's Stubber, answering as SageMaker does; the logs are moto's, read as put there."""
    name = names.training_job_name(TEAM, "sm-run")
    started = put_training_job_lines(
        deployed,
        name,
        [
            (0, "Invoking script with the following command: python train.py"),
            (4, "curl: (6) Could not resolve host: mlflow"),
        ],
    )
    sagemaker = deployed.client("sagemaker")
    with Stubber(sagemaker) as stub:
        stub.add_response("describe_training_job", describe_failed(name), {"TrainingJobName": name})
        reading = read_training_job(sagemaker, name)
    logs = read_log_verdicts(
        deployed.client("logs"), sagemaker_job_logs(group=names.SAGEMAKER_LOG_GROUP, training_job_name=name)
    )
    result = diagnose_job(TEAM, reading, logs=logs)
    assert result.headline() == (
        'training-job-failed: "AlgorithmError: ExecuteUserScriptError: Command "python train.py" exit status 1": '
        f"SageMaker training job {name} Failed at 2026-12-01 10:05:00 UTC; Starting at 2026-12-01 10:00:00 UTC "
        '"Preparing the instances for training" -> Training at 2026-12-01 10:04:00 UTC "Training image download '
        'completed." -> Failed at 2026-12-01 10:05:00 UTC "Training job failed"'
    )
    [dns] = [v for v in result.verdicts if v.check == "logs"]
    assert dns.verdict == "dns-at-start" and dns.evidence == (
        f'{name}/algo-1-1764583200: "curl: (6) Could not resolve host: mlflow" at {at_utc(started + 4000)}, '
        "4 s after its container started"
    )
    assert result.as_dict()["training_job"]["description"]["FailureReason"].startswith("AlgorithmError")


def test_doctor_target_sagemaker_reads_the_teams_training_job_logs_as_the_reader(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """The CLI end to end on moto: the job is not known to moto's SageMaker (a WARN), its log is; another team's
    job with a like name is not read."""
    name = names.training_job_name(TEAM, "oom-sm")
    started = put_training_job_lines(
        deployed,
        name,
        [
            (0, "start"),
            *((1.0 + i, f"step {i}") for i in range(30)),
            (50, "torch.OutOfMemoryError: CUDA out of memory."),
        ],
    )
    put_lines(deployed, names.SAGEMAKER_LOG_GROUP, f"{name}x/algo-1-1764583200", [(1, "NCCL error: unhandled")])
    answer = answered(deployed, kubernetes, "--job", name, "--target", "sagemaker")
    assert answer["headline"] == (
        f'cuda-oom-before-end: {name}/algo-1-1764583200: "torch.OutOfMemoryError: CUDA out of memory." at '
        f"{at_utc(started + 50_000)}, 50 s after its container started"
    )
    orchestrator = answer["verdicts"][0]
    assert orchestrator["verdict"] == "no job" and name in orchestrator["evidence"]
    assert [v["verdict"] for v in answer["verdicts"] if v["check"] == "logs"] == ["cuda-oom-before-end"]


def test_a_sagemaker_job_carrying_a_beacon_runs_settings_is_known_by_them_and_only_they_are_kept(
    deployed: DeployedTeam,
) -> None:
    """`--job NAME --target sagemaker` on a Beacon job gets its run's whole diagnosis: the run comes from the job's
    environment. Nothing else of that environment is kept: a team's own variables may be secrets."""
    name = names.training_job_name(TEAM, "env-run")
    described = {
        **describe_failed(name),
        "Environment": {
            "BEACON_TEAM": TEAM,
            "BEACON_EXPERIMENT": "resnet",
            "BEACON_RUN_ID": "env-run",
            "HF_TOKEN": "x",
        },
    }
    sagemaker = deployed.client("sagemaker")
    with Stubber(sagemaker) as stub:
        stub.add_response("describe_training_job", described, {"TrainingJobName": name})
        reading = read_training_job(sagemaker, name)
    assert reading.beacon == {"BEACON_TEAM": TEAM, "BEACON_EXPERIMENT": "resnet", "BEACON_RUN_ID": "env-run"}
    assert "HF_TOKEN" not in json.dumps(diagnose_job(TEAM, reading).as_dict(), default=str)


def test_a_beacon_run_whose_sagemaker_job_failed_leads_with_the_failure_reason(deployed: DeployedTeam) -> None:
    """`--run R --target sagemaker`: the run's own evidence is read too, and SageMaker's reason still leads."""
    name = names.training_job_name(TEAM, "sm-beacon")
    sagemaker = deployed.client("sagemaker")
    with Stubber(sagemaker) as stub:
        stub.add_response("describe_training_job", describe_failed(name), {"TrainingJobName": name})
        reading = read_training_job(sagemaker, name)
    result = diagnose(
        DoctorInputs(
            team=TEAM,
            experiment="smoke",
            run="sm-beacon",
            bucket=BUCKET,
            region="us-east-1",
            s3=deployed.client("s3"),
            cloudwatch=deployed.client("cloudwatch"),
            training_job=reading,
        )
    )
    assert result.headline().startswith('training-job-failed: "AlgorithmError: ExecuteUserScriptError'), (
        result.headline()
    )
    assert "delivery" in [v.check for v in result.verdicts]
    (job,) = [v for v in result.verdicts if v.check == "job"]
    assert job.verdict == "not started" and "kubectl" not in job.fix, "a SageMaker run's own log, not a pod's"
    assert f"aws logs tail /aws/sagemaker/TrainingJobs --log-stream-name-prefix {name}/" in job.fix


def test_a_finished_job_whose_log_retried_past_timeouts_and_refusals_is_still_finished(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """Startup and shutdown noise of a healthy run: the TCPStore's refused connections while the workers wait for
    rank 0, a retried read timeout, nccl's "not destroyed" warning at exit. The Job completed: the log's lines are
    warnings beside it, never the cause."""
    job = foreign_job("noisy-job", active=0, succeeded=1)
    job["status"]["conditions"] = [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-12-01T11:00:00Z"}]
    finished = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2026-12-01T10:00:00Z"}}
    kubernetes.seed(job=job, pods=[pod(job, "n0i5y", phase="Succeeded", state=finished)])
    lines = [
        (0, "[c10d] The client socket has failed to connect to [train-0]:29500 (errno: 111 - Connection refused)."),
        (3, "urllib3: Retrying after connection broken by 'ReadTimeoutError(...): Read timed out.'"),
        *((4.0 + i, f"step {i} loss 0.5") for i in range(30)),
        (40, "ProcessGroupNCCL.cpp: WARNING: process group has NOT been destroyed before we destruct ProcessGroupNCCL"),
    ]
    name = "noisy-job-n0i5y"
    put_lines(deployed, CLUSTER_LOGS, stream_of(name), [(at, fluent_bit(text, name)) for at, text in lines])
    done = doctor(deployed, kubernetes, "--job", "noisy-job")
    assert done.returncode == 0, done.stdout + done.stderr
    assert first_line(done).startswith("finished: Job training/noisy-job Complete"), first_line(done)
    answer = answered(deployed, kubernetes, "--job", "noisy-job", code=0)
    logs = [v for v in answer["verdicts"] if v["check"] == "logs"]
    assert logs and {v["status"] for v in logs} == {"warn"}, logs


def test_without_pod_labels_in_the_log_another_jobs_look_alike_pod_is_not_read(
    deployed: DeployedTeam, kubernetes: FakeKubernetes
) -> None:
    """The observability add-on's Fluent Bit leaves pod labels out by default. Job `look-2`'s pod `look-2-q1w2e`
    has the name an Indexed Job `look` would give its pod 2: the doctor reads only the pods the orchestrator
    named for `look`, so the other Job's refused connection is not this run's."""
    job = beacon_job("look", active=0, failed=1)
    kubernetes.seed(job=job, pods=[pod(job, "0-k1j2h", phase="Failed", state=FAILED)])
    put_lines(deployed, CLUSTER_LOGS, stream_of("look-0-k1j2h"), [(0, fluent_bit("starting", "look-0-k1j2h"))])
    put_lines(deployed, CLUSTER_LOGS, stream_of("look-2-q1w2e"), [(2, fluent_bit(REFUSED, "look-2-q1w2e"))])
    answer = answered(deployed, kubernetes, "--run", "look")
    [logs] = [v for v in answer["verdicts"] if v["check"] == "logs"]
    assert logs["verdict"] == "nothing known" and answer["diagnosis"] == "exit-code", answer["headline"]
