"""`beacon smoke`, the post-deploy test, as a real subprocess against a moto server.

The team is "deployed" into moto (tests/support/deployed_team.py). What no machine here can run is
faked, and each test's name says so: the Kubernetes API (tests/support/fake_kubernetes.py) and
SageMaker's training instances (tests/support/sagemaker_standin.py). In both, the job that runs is the
real training job, as a local process, writing as the writer role.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import boto3
import pytest
from beacon import contract

from beacon_ops.jobs.eks import TOKEN_PREFIX, eks_token
from beacon_ops.jobs.flow import read_outputs
from config import TeamConfig, names
from stacks.outputs import OPERATOR_NEEDS as STACK_OUTPUTS
from tests.support.deployed_team import BUCKET, IMAGE, TEAM, DeployedTeam, deploy_stand_in, fake_cluster
from tests.support.fake_kubernetes import FakeKubernetes
from tests.support.job_harness import wait_for
from tests.support.moto_server import REGION, MotoServer
from tests.support.sagemaker_standin import SageMakerStandIn
from tests.support.synth import ROOT, Synthesized
from workloads import manifests

# moto's CloudFormation parses the stand-in stacks' one placeholder resource with a warning.
pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS..CloudFormation..WaitConditionHandle")


def smoke(
    deployed: DeployedTeam, target: str, report: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return deployed.cli(*("--target", target, "--report", str(report), "--poll-interval", "0.5", *extra), extra_env=env)


def smoke_eks(
    deployed: DeployedTeam, fake: FakeKubernetes, report: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    return smoke(deployed, "eks", report, "--kubernetes-url", fake.url, *extra)


# --- what the command reads is what the stacks write ------------------------------------------
def test_every_output_smoke_reads_is_declared_by_the_synthesized_stacks(demo: Synthesized) -> None:
    for component, keys in STACK_OUTPUTS.items():
        declared = set(demo.templates[names.stack_name(TEAM, component)].body.get("Outputs", {}))
        assert set(keys) <= declared, component
    monitoring = demo.templates[names.stack_name(TEAM, "monitoring")].body["Outputs"]
    assert len([k for k in monitoring if k.endswith("AlarmName")]) == len(contract.TeamAlarm)


def test_outputs_are_read_from_cloudformation_in_moto(deployed: DeployedTeam) -> None:
    outputs = read_outputs(deployed.client("cloudformation"), TEAM, REGION)
    assert outputs.bucket == BUCKET and outputs.image_uri == IMAGE
    assert outputs.writer_role_arn == deployed.provisioned.store.writer_role_arn
    assert sorted(outputs.team_alarm_names) == sorted(deployed.provisioned.monitoring.team_alarm_names)


def test_the_eks_token_is_a_presigned_get_caller_identity_naming_the_cluster() -> None:
    session = boto3.session.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name=REGION)
    token = eks_token(session, "beacon-demo", REGION)
    assert token.startswith(TOKEN_PREFIX) and "=" not in token
    encoded = token.removeprefix(TOKEN_PREFIX)
    url = urlparse(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode())
    query = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert url.hostname == f"sts.{REGION}.amazonaws.com"
    assert query["Action"] == "GetCallerIdentity" and query["X-Amz-Expires"] == "60"
    assert query["X-Amz-Credential"].startswith("AKIDEXAMPLE/") and "/sts/aws4_request" in query["X-Amz-Credential"]
    assert set(query["X-Amz-SignedHeaders"].split(";")) == {"host", "x-k8s-aws-id"}


# --- EKS: the fake Kubernetes API runs the real job against moto ------------------------------
def test_smoke_eks_on_a_fake_kubernetes_api_runs_the_real_job_on_moto_and_proves_it(
    deployed: DeployedTeam, kubernetes: FakeKubernetes, demo_config: TeamConfig, tmp_path: Path
) -> None:
    done = smoke_eks(deployed, kubernetes, tmp_path / "report.json")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:] + str(kubernetes.refused)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] and report["target"] == "eks"
    v = report["verification"]
    assert v["records_in_s3"] == v["steps_expected"] == demo_config.training.smoke_steps
    assert v["records_lost"] == 0 and v["records_duplicated"] == 0 and v["writer_ranks"] == [0]
    assert set(v["chunk_versions"].values()) == {1} and v["bucket_versioning"] == "Enabled"
    assert v["checkpoints"] >= 1 and v["succeeded"]
    assert v["metrics_missing"] == [] and v["cloudwatch_datapoints"] > 0
    assert v["alarms"] and "ALARM" not in v["alarms"].values()
    assert report["alarms_observed"] and "ALARM" not in report["alarms_observed"].values()
    assert report["platform"]["state"] == "Complete"
    assert report["stack_outputs"]["alarm_topic_arn"] == deployed.provisioned.monitoring.topic_arn

    # The Job is the stack's own manifest builder's, for a fresh run name.
    (job,) = kubernetes.jobs.values()
    suffix = job.name[len("beacon-smoke-") + 8 :]
    spec = manifests.smoke_job_spec(demo_config, image=IMAGE, bucket=BUCKET, region=REGION, name_suffix=suffix)
    assert job.manifest == manifests.smoke_job(spec)[0]
    assert report["run"] == job.name
    # Every call carried an EKS token; the Job was deleted and nothing runs on.
    assert kubernetes.refused == []
    assert report["cleaned_up"] and job.deleted and kubernetes.running_processes() == 0
    assert "records in S3" in done.stdout and "passed" in done.stdout


def test_smoke_eks_on_a_fake_kubernetes_api_collects_pod_logs_and_cleans_up_when_the_job_fails(
    deployed: DeployedTeam, tmp_path: Path
) -> None:
    no_rights = deployed.aws.user_without_rights("beacon-pod-without-rights")
    fake = fake_cluster(deployed, tmp_path / "cluster", pod_credentials=no_rights)
    try:
        done = smoke_eks(deployed, fake, tmp_path / "report.json")
    finally:
        fake.stop()
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert not report["ok"]
    assert report["platform"]["state"] == "Failed" and "PodFailurePolicy" in report["platform"]["detail"]
    train_logs = [text for source, text in report["logs"].items() if source.endswith("/train")]
    assert train_logs and "beacon preflight:" in train_logs[0]
    assert report["verification"]["records_in_s3"] == 0
    assert {row["check"] for row in report["doctor"]}, "the doctor explains the failure"
    (job,) = fake.jobs.values()
    assert len(job.pods) == 1, "exit code 3 fails the Job at once: no retries"
    assert report["cleaned_up"] and job.deleted
    assert "beacon preflight:" in done.stdout


def test_smoke_eks_on_a_fake_kubernetes_api_gives_up_when_no_pod_becomes_ready_in_time(
    deployed: DeployedTeam, tmp_path: Path
) -> None:
    fake = fake_cluster(deployed, tmp_path / "cluster")
    fake.schedulable = False
    try:
        done = smoke_eks(deployed, fake, tmp_path / "report.json", "--start-timeout", "3")
    finally:
        fake.stop()
    assert done.returncode == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["platform"]["state"] == "NotReady"
    assert "Unschedulable" in report["platform"]["detail"] and "within 3 s" in report["platform"]["detail"]
    (job,) = fake.jobs.values()
    assert job.deleted


def test_smoke_eks_refuses_a_wrong_token_signer_on_the_fake_kubernetes_api_with_one_line(
    deployed: DeployedTeam, tmp_path: Path
) -> None:
    fake = fake_cluster(deployed, tmp_path / "cluster")
    fake.access_key_id = "AKIASOMEBODYELSE"
    try:
        done = smoke_eks(deployed, fake, tmp_path / "report.json")
    finally:
        fake.stop()
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "refused" in line and "access entry" in line and "namespace training" in line
    assert fake.jobs == {}


def test_smoke_names_the_missing_stack_in_one_line(
    demo: Synthesized, moto_server: MotoServer, eks_api: MotoServer
) -> None:
    team = deploy_stand_in(demo, moto_server, eks_api, stacks=False)
    done = team.cli("--target", "eks")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert (
        line
        == f"beacon smoke: stack beacon-demo-artifacts not found in {REGION}: deploy it first (make deploy TEAM=demo)"
    )


# --- SageMaker: moto's create/describe, a local process standing in for the instance ------------
def smoke_sagemaker(
    deployed: DeployedTeam, standin: SageMakerStandIn, report: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    return smoke(deployed, "sagemaker", report, *extra, env={"AWS_ENDPOINT_URL_SAGEMAKER": standin.url})


def test_smoke_sagemaker_on_moto_with_a_local_process_standing_in_for_the_training_instance(
    deployed: DeployedTeam, sagemaker: SageMakerStandIn, demo_config: TeamConfig, tmp_path: Path
) -> None:
    done = smoke_sagemaker(deployed, sagemaker, tmp_path / "report.json")
    standin = sagemaker
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] and report["platform"]["state"] == "Completed"
    v = report["verification"]
    assert v["records_in_s3"] == demo_config.training.smoke_steps and v["records_lost"] == v["records_duplicated"] == 0
    assert v["checkpoints"] >= 1 and v["metrics_missing"] == [] and "ALARM" not in v["alarms"].values()

    # What was sent to SageMaker, as sent.
    (job,) = standin.jobs.values()
    request = job.request
    run = report["run"]
    assert request["TrainingJobName"] == names.training_job_name(TEAM, run)  # the reader may read its logs
    assert request["RoleArn"] == deployed.provisioned.store.writer_role_arn
    spec = request["AlgorithmSpecification"]
    assert spec["TrainingImage"] == IMAGE
    assert spec["ContainerEntrypoint"] == manifests.LAUNCH_COMMAND
    assert spec["ContainerArguments"][-2:] == ["-m", "smoke_job.train"]
    assert {m["Name"]: m["Regex"] for m in spec["MetricDefinitions"]} == contract.PROGRESS_LOG_METRICS
    assert request["CheckpointConfig"] == {
        "S3Uri": f"s3://{BUCKET}/{contract.run_prefix('smoke', run)}{manifests.SAGEMAKER_VOLUME_KIND}/",
        "LocalPath": manifests.SAGEMAKER_VOLUME,
    }
    assert request["Environment"]["PYTHONUNBUFFERED"] == "1"
    assert request["Environment"]["BEACON_RUN_ID"] == run
    assert request["Environment"]["BEACON_SPOOL_DIR"].startswith(manifests.SAGEMAKER_VOLUME)
    assert request["StoppingCondition"]["MaxRuntimeInSeconds"] == demo_config.training.sagemaker_max_runtime_seconds
    assert request["ResourceConfig"]["InstanceType"] == demo_config.training.sagemaker_instance_type
    assert "StopTrainingJob" not in standin.calls, "a finished job is not stopped"
    # What SageMaker itself did as the execution role, through the strict endpoint: the output upload passed the
    # bucket policy (no If-None-Match: issue 25, item 1), and the log and metrics were the role's to write (item 3).
    output = f"{contract.run_prefix('smoke', run)}{contract.SAGEMAKER_OUTPUT}/{request['TrainingJobName']}/output/"
    assert standin.uploads == [
        ("PutObject", f"{output}model.tar.gz"),
        ("CompleteMultipartUpload", f"{output}output.tar.gz"),
    ]
    deployed.aws.reset_auth_only()
    streams = deployed.client("logs").describe_log_streams(logGroupName=names.SAGEMAKER_LOG_GROUP)["logStreams"]
    assert [s["logStreamName"].split("/")[0] for s in streams] == [request["TrainingJobName"]]
    published = deployed.client("cloudwatch").list_metrics(Namespace=names.SAGEMAKER_LOG_GROUP)["Metrics"]
    assert {m["MetricName"] for m in published} == set(contract.PROGRESS_LOG_METRICS)
    # The metric definitions parse the job's own progress lines.
    (instance,) = job.instances
    log = instance.log_path.read_text()
    steps = [int(m) for m in re.findall(contract.PROGRESS_LOG_METRICS["step"], log)]
    losses = [float(m) for m in re.findall(contract.PROGRESS_LOG_METRICS["loss"], log)]
    assert (
        steps[0] == 0
        and len(steps) == len(losses) >= demo_config.training.smoke_steps // contract.PROGRESS_LOG_INTERVAL
    )


def test_smoke_sagemaker_with_a_stand_in_instance_reports_the_failure_reason_and_the_logs(
    deployed: DeployedTeam, sagemaker: SageMakerStandIn, tmp_path: Path
) -> None:
    """The execution role loses its rights but what SageMaker's own log writing needs: the job's preflight fails
    (S3 and CloudWatch refused), SageMaker says Failed, and the log it wrote holds the preflight's line."""
    logs_only = deployed.aws.user_without_rights("beacon-execution-logs-only")
    deployed.aws.reset_auth_only()
    deployed.aws.client("iam").put_user_policy(
        UserName="beacon-execution-logs-only",
        PolicyName="sagemaker-writes-logs",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "logs:*", "Resource": "*"}]}
        ),
    )
    deployed.aws.enforce_iam()
    sagemaker.role_credentials = lambda _arn: logs_only
    done = smoke_sagemaker(deployed, sagemaker, tmp_path / "report.json")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["platform"]["state"] == "Failed" and "exited with code 3" in report["platform"]["detail"]
    (log,) = report["logs"].values()
    assert "beacon preflight:" in log
    assert report["doctor"] and not report["ok"]
    # `beacon doctor` on the failed training job, through the CLI: SageMaker's FailureReason leads, for the run
    # (its evidence read too) and for the job by name (as a job without Beacon would be)
    reason = '"AlgorithmError: the container on algo-1 exited with code 3"'
    standin = {"AWS_ENDPOINT_URL_SAGEMAKER": sagemaker.url}
    for asked in (("--run", report["run"]), ("--job", names.training_job_name(TEAM, report["run"]))):
        doctor = deployed.cli(*asked, "--target", "sagemaker", "--json", verb="doctor", extra_env=standin, timeout=120)
        assert doctor.returncode == 1, doctor.stdout[-2000:] + doctor.stderr[-2000:]
        answer = json.loads(doctor.stdout)
        assert answer["headline"].startswith(f"training-job-failed: {reason}: SageMaker training job "), answer
        assert answer["training_job"]["description"]["TrainingJobStatus"] == "Failed"


def test_a_sagemaker_checkpoint_directory_the_image_cannot_write_fails_at_once_in_one_line_naming_it(
    deployed: DeployedTeam, sagemaker: SageMakerStandIn, tmp_path: Path
) -> None:
    """SageMaker creates /opt/ml itself, and an image running as uid 1000 can find /opt/ml/checkpoints root's
    (issue 25, item 4). The entry point says so in one line naming the setting and the directory, exit 3, before
    any rank starts. The directory is mode 0555; as root, which mode bits do not stop, a read-only mount."""
    mounted: list[Path] = []
    volumes: list[Path] = []

    def read_only(volume: Path) -> None:
        volumes.append(volume)
        if os.geteuid() != 0:
            volume.chmod(0o555)
            return
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(volume)], capture_output=True)
        if done.returncode:
            pytest.skip(f"cannot mount a read-only directory here as root: {done.stderr.decode().strip()}")
        mounted.append(volume)

    sagemaker.prepare_volume = read_only
    try:
        done = smoke_sagemaker(deployed, sagemaker, tmp_path / "report.json")
    finally:
        for volume in mounted:
            subprocess.run(["umount", "-l", str(volume)], check=False)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["platform"]["state"] == "Failed" and "exited with code 3" in report["platform"]["detail"]
    (log,) = report["logs"].values()
    (line,) = [line for line in log.splitlines() if line.startswith("beacon.launch:")]
    assert line.startswith(f"beacon.launch: BEACON_SPOOL_DIR: {volumes[0]}/spool is not writable as uid"), line
    assert ("Read-only file system" in line or "Permission denied" in line) and "run the image as root" in line, line
    assert "Traceback" not in log and "torchrun" not in log.lower(), "it stopped before torchrun started a rank"


def test_smoke_sagemaker_with_a_stand_in_instance_stops_a_job_that_outlives_its_bound(
    deployed: DeployedTeam, sagemaker: SageMakerStandIn, tmp_path: Path
) -> None:
    done = smoke_sagemaker(deployed, sagemaker, tmp_path / "report.json", "--timeout", "5")
    assert done.returncode == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["platform"]["state"] == "TimedOut"
    assert "StopTrainingJob" in sagemaker.calls, "no instance is left billing"
    (job,) = sagemaker.jobs.values()
    assert job.process.wait(timeout=120) == 0, "SIGTERM: the job drains and exits cleanly"


def test_smoke_eks_says_in_one_line_when_the_kubernetes_api_cannot_be_reached(
    deployed: DeployedTeam, tmp_path: Path
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{probe.getsockname()[1]}"
    done = deployed.cli("--target", "eks", "--kubernetes-url", nobody, "--report", str(tmp_path / "r.json"))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert f"cannot reach the Kubernetes API of beacon-demo at {nobody}" in line and "--kubernetes-url" in line


def test_smoke_eks_stopped_with_sigterm_deletes_its_job_on_the_fake_kubernetes_api(
    deployed: DeployedTeam, kubernetes: FakeKubernetes, tmp_path: Path
) -> None:
    """A cancelled pipeline step: the Job is deleted (its pods get SIGTERM) before the command exits."""
    cli = subprocess.Popen(
        deployed.command(
            *("--target", "eks", "--kubernetes-url", kubernetes.url, "--report", str(tmp_path / "r.json")),
            *("--poll-interval", "0.5"),
        ),
        cwd=ROOT,
        env=deployed.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: any(p.ready for j in kubernetes.jobs.values() for p in j.pods), timeout=120)
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=150) == 128 + signal.SIGTERM
    finally:
        if cli.poll() is None:
            cli.kill()
    (job,) = kubernetes.jobs.values()
    assert job.deleted and kubernetes.running_processes() == 0
