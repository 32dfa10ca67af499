"""`beacon run`: a team's own job (its image, its command) on the deployed stack, end to end through
the CLI, followed and verified as `beacon smoke` verifies the smoke job.

The team is "deployed" into moto (tests/support/deployed_team.py). The fake Kubernetes API and the
SageMaker stand-in run the container's real entry point as a local process: torchrun (`beacon.launch`)
running the plain DDP example (examples/plain_ddp.py), which uses only the public `beacon` API.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from beacon import contract

from beacon_ops.jobs.flow import JobError
from beacon_ops.jobs.team import TeamJobRequest, check_sagemaker_gpus, instance_gpus
from config import TeamConfig, load_team, names
from tests.support.deployed_team import BUCKET, TEAM, DeployedTeam, fake_cluster
from tests.support.fake_kubernetes import FakeKubernetes
from tests.support.moto_server import REGION
from tests.support.sagemaker_standin import SageMakerStandIn
from workloads import manifests

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS..CloudFormation..WaitConditionHandle")
STEPS = 30
TEAM_JOB = ("examples/plain_ddp.py", "--steps", str(STEPS), "--checkpoint-every", "10")
EXPERIMENT = "plain-ddp"  # the name the example's beacon.init gives its experiment


def run_cli(
    deployed: DeployedTeam, *options: str, command: tuple[str, ...], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return deployed.cli(*options, "--poll-interval", "0.5", "--", *command, extra_env=env, verb="run")


def read_report(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def team_image(deployed: DeployedTeam, tag: str) -> str:
    return f"{deployed.outputs['artifacts']['ImageRepositoryUri']}:{tag}"


def assert_the_run_is_proved(report: dict[str, Any]) -> None:
    """What `beacon run` verifies of a job whose step count it did not know."""
    assert report["ok"] and report["command"] == "run" and report["experiment"] == EXPERIMENT
    v = report["verification"]
    assert v["steps_expected"] is None, "a team's job logs as many steps as it does"
    assert v["records_in_s3"] == v["records_numbered"] == STEPS, "every record the spool numbered is in S3"
    assert v["records_lost"] == 0 and v["records_duplicated"] == 0 and v["writer_ranks"] == [0]
    assert v["last_step_in_s3"] == v["last_step_final"] == STEPS - 1, "the tail the job logged reached S3"
    assert v["succeeded"], "final state: finished"
    assert set(v["chunk_versions"].values()) == {1} and v["bucket_versioning"] == "Enabled"
    assert v["metrics_missing"] == [] and v["cloudwatch_datapoints"] > 0
    assert "ALARM" not in v["alarms"].values() and "ALARM" not in report["alarms_observed"].values()
    assert v["checkpoints"] >= 1 and not v["checkpoint_required"]


def test_run_eks_on_a_fake_kubernetes_api_runs_a_teams_own_job_on_moto_and_proves_it(
    deployed: DeployedTeam, kubernetes: FakeKubernetes, demo_config: TeamConfig, tmp_path: Path
) -> None:
    done = run_cli(
        deployed,
        *("--image", ":v1", "--experiment", EXPERIMENT, "--run", "plain-ddp-try-1"),
        *("--kubernetes-url", kubernetes.url, "--report", str(tmp_path / "report.json")),
        command=TEAM_JOB,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:] + str(kubernetes.refused)
    report = read_report(tmp_path / "report.json")
    assert_the_run_is_proved(report)
    assert report["run"] == "plain-ddp-try-1" and report["platform"]["state"] == "Complete"
    assert report["launched"]["image_in_team_repository"] is True

    # The Job is the stack's builder's, for the team repository's image and the team's command.
    (job,) = kubernetes.jobs.values()
    spec = manifests.TrainingJobSpec(
        team=TEAM,
        image=team_image(deployed, "v1"),
        bucket=BUCKET,
        region=REGION,
        uid=demo_config.training.uid,
        gid=demo_config.training.gid,
        name="plain-ddp-try-1",
        command=TEAM_JOB,
        experiment=EXPERIMENT,
        heartbeat_interval=demo_config.monitoring.heartbeat_interval_seconds,
    )
    assert job.manifest == manifests.training_job(spec)[0]
    # An ended Job stays for its TTL with its pods' logs; the report has their tail too.
    assert not job.deleted and not report["cleaned_up"] and kubernetes.running_processes() == 0
    (train_log,) = [text for source, text in report["logs"].items() if source.endswith("/train")]
    assert f"finished: last step {STEPS - 1}" in train_log
    assert "records in S3" in done.stdout and "passed" in done.stdout


def test_run_eks_on_a_fake_kubernetes_api_fails_the_verdict_of_a_team_job_that_fails(
    deployed: DeployedTeam, kubernetes: FakeKubernetes, tmp_path: Path
) -> None:
    """Bad input to the job's own script (argparse exits 2): the pod-failure policy fails the Job at
    once, the verdict is exit 1 with the job's log and the doctor's verdicts."""
    done = run_cli(
        deployed,
        *("--image", ":v1", "--experiment", EXPERIMENT, "--kubernetes-url", kubernetes.url),
        *("--report", str(tmp_path / "report.json")),
        command=("examples/plain_ddp.py", "--steps", "many"),
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    report = read_report(tmp_path / "report.json")
    assert not report["ok"] and report["run"].startswith(f"{EXPERIMENT}-")
    assert report["platform"]["state"] == "Failed" and "PodFailurePolicy" in report["platform"]["detail"]
    (train_log,) = [text for source, text in report["logs"].items() if source.endswith("/train")]
    assert "invalid int value: 'many'" in train_log
    assert report["verification"]["records_in_s3"] == 0 and report["doctor"]
    (job,) = kubernetes.jobs.values()
    assert len(job.pods) == 1 and not job.deleted, "failed at once, and kept (it ended) with its logs"


def test_run_eks_for_two_nodes_of_two_gpus_builds_an_indexed_job_and_a_headless_service(
    deployed: DeployedTeam, tmp_path: Path
) -> None:
    """No pod can be scheduled (no node fits): the command gives up, deletes the Job that never ended
    and its Service, and what it created is what a two-node job needs."""
    fake = fake_cluster(deployed, tmp_path / "cluster")
    fake.schedulable = False
    image = f"123456789012.dkr.ecr.{REGION}.amazonaws.com/shared/llm@sha256:{'ab' * 32}"
    try:
        done = run_cli(
            deployed,
            *("--image", image, "--nodes", "2", "--gpus-per-node", "2", "--experiment", "llm", "--run", "llm-2x2"),
            *("--env", "NCCL_DEBUG=INFO", "--start-timeout", "2", "--kubernetes-url", fake.url),
            *("--report", str(tmp_path / "report.json")),
            command=("-m", "team.train", "--lr", "3e-4"),
        )
    finally:
        fake.stop()
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    report = read_report(tmp_path / "report.json")
    assert report["platform"]["state"] == "NotReady" and report["cleaned_up"]
    assert report["launched"]["image_in_team_repository"] is False, "another repository: allowed, and said"

    (job,) = fake.jobs.values()
    spec = job.manifest["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 2
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in spec["podFailurePolicy"]["rules"]
    assert spec["template"]["metadata"]["annotations"] == {manifests.DO_NOT_DISRUPT: "true"}
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "llm-2x2-ranks" and pod["nodeSelector"] == {manifests.POOL_LABEL: manifests.GPU_POOL}
    assert pod["securityContext"]["runAsUser"] == 1000 and pod["terminationGracePeriodSeconds"] >= 60
    container = pod["containers"][0]
    assert container["image"] == image and container["command"] == manifests.LAUNCH_COMMAND
    assert container["args"] == [
        "--nnodes=2",
        "--node-rank=$(JOB_COMPLETION_INDEX)",
        "--master-addr=llm-2x2-0.llm-2x2-ranks.training.svc",
        f"--master-port={manifests.RENDEZVOUS_PORT}",
        "--nproc-per-node=2",
        *("-m", "team.train", "--lr", "3e-4"),
    ]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    probe = " ".join(container["livenessProbe"]["exec"]["command"])
    assert all(path in probe for path in manifests.liveness_files(2)), "every rank's own sign of life"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["BEACON_EXPERIMENT"] == "llm" and env["BEACON_RUN_ID"] == "llm-2x2" and env["BEACON_BUCKET"] == BUCKET
    assert env["NCCL_DEBUG"] == "INFO"
    (service,) = fake.created_services
    assert service["metadata"]["name"] == "llm-2x2-ranks" and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": "llm-2x2"}
    assert job.deleted and fake.services == {}, "a Job that never ended is deleted, its Service with it"


def test_run_sagemaker_with_a_stand_in_instance_sends_the_image_and_command_and_proves_the_run(
    deployed: DeployedTeam, sagemaker: SageMakerStandIn, demo_config: TeamConfig, tmp_path: Path
) -> None:
    done = run_cli(
        deployed,
        *("--target", "sagemaker", "--image", ":v1", "--experiment", EXPERIMENT, "--run", "plain-ddp-sm"),
        *("--report", str(tmp_path / "report.json")),
        command=TEAM_JOB,
        env={"AWS_ENDPOINT_URL_SAGEMAKER": sagemaker.url},
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    report = read_report(tmp_path / "report.json")
    assert_the_run_is_proved(report)
    assert report["platform"]["state"] == "Completed"

    (job,) = sagemaker.jobs.values()
    request = job.request
    algorithm = request["AlgorithmSpecification"]
    assert algorithm["TrainingImage"] == team_image(deployed, "v1")
    assert algorithm["ContainerEntrypoint"] == manifests.LAUNCH_COMMAND
    assert algorithm["ContainerArguments"] == [contract.SAGEMAKER_RENDEZVOUS, "--nproc-per-node=1", *TEAM_JOB]
    assert request["ResourceConfig"]["InstanceCount"] == 1
    assert request["ResourceConfig"]["InstanceType"] == demo_config.training.sagemaker_instance_type
    assert request["RoleArn"] == deployed.provisioned.store.writer_role_arn
    assert request["Environment"]["BEACON_EXPERIMENT"] == EXPERIMENT
    assert request["Environment"]["BEACON_RUN_ID"] == "plain-ddp-sm"
    assert request["CheckpointConfig"]["S3Uri"] == (
        f"s3://{BUCKET}/{contract.run_prefix(EXPERIMENT, 'plain-ddp-sm')}{manifests.SAGEMAKER_VOLUME_KIND}/"
    )
    assert {"Key": "beacon:component", "Value": "beacon-training"} in request["Tags"]
    assert "StopTrainingJob" not in sagemaker.calls, "a finished job is not stopped"


def test_run_sagemaker_refuses_gpus_per_node_the_instance_type_does_not_have(
    deployed: DeployedTeam, demo_config: TeamConfig
) -> None:
    """One rank per GPU: on SageMaker --gpus-per-node must be what the team's instance type has, as EC2 describes
    it. The demo team's ml.m5.xlarge has none: refused in one line, before anything is launched."""
    assert demo_config.training.sagemaker_instance_type == "ml.m5.xlarge"
    done = run_cli(deployed, "--target", "sagemaker", "--image", ":v1", "--gpus-per-node", "1", command=TEAM_JOB)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "beacon run: --gpus-per-node: 1, but training.sagemaker_instance_type ml.m5.xlarge has no GPU: give 0 "
        "(one rank on its CPUs), or set a GPU instance type in the team file"
    )
    four = demo_config.model_copy(
        update={"training": demo_config.training.model_copy(update={"sagemaker_instance_type": "ml.g5.12xlarge"})}
    )
    ec2 = deployed.client("ec2")
    assert instance_gpus(ec2, "ml.g5.12xlarge") == 4 and instance_gpus(ec2, "ml.m5.xlarge") == 0
    assert instance_gpus(ec2, "ml.nosuch.xlarge") is None, "EC2 does not know it: not checked"
    request = TeamJobRequest(image=":v1", command=TEAM_JOB, nodes=1, gpus_per_node=2, target="sagemaker")
    with pytest.raises(JobError, match=r"ml\.g5\.12xlarge has 4 GPU\(s\): give 4 \(one rank per GPU\)"):
        check_sagemaker_gpus(request, four, instance_gpus(ec2, "ml.g5.12xlarge"))
    check_sagemaker_gpus(replace(request, gpus_per_node=4), four, 4)


def test_run_sagemaker_on_two_instances_rendezvous_from_each_instances_resource_config_and_proves_the_run(
    deployed: DeployedTeam, sagemaker: SageMakerStandIn, demo_config: TeamConfig, tmp_path: Path
) -> None:
    """`--nodes 2 --target sagemaker`: one training job of two instances, each running the same arguments. The
    stand-in runs one process per instance, each with its own /opt/ml/checkpoints (no shared volume) and its own
    resourceconfig.json; torchrun's rendezvous comes from that file (beacon.launch). Rank 0 alone writes the run;
    each node's evidence reaches S3 under its own create-only keys."""
    run = "plain-ddp-sm2"
    done = run_cli(
        deployed,
        *("--target", "sagemaker", "--nodes", "2", "--image", ":v1", "--experiment", EXPERIMENT, "--run", run),
        *("--report", str(tmp_path / "report.json")),
        command=TEAM_JOB,
        env={"AWS_ENDPOINT_URL_SAGEMAKER": sagemaker.url},
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    report = read_report(tmp_path / "report.json")
    assert_the_run_is_proved(report)
    (job,) = sagemaker.jobs.values()
    assert job.request["ResourceConfig"]["InstanceCount"] == 2 and [i.host for i in job.instances] == [
        "algo-1",
        "algo-2",
    ]
    assert job.request["AlgorithmSpecification"]["ContainerArguments"][0] == contract.SAGEMAKER_RENDEZVOUS
    assert all(instance.process.returncode == 0 for instance in job.instances)

    # Each instance's volume holds its own node's rank, placed by SageMaker's names.
    placed = {}
    for instance in job.instances:
        ranks_dir = (
            sagemaker.volume(job.request["TrainingJobName"], instance.host) / "spool" / EXPERIMENT / run / "ranks"
        )
        documents = {p.name: json.loads(p.read_text()) for p in ranks_dir.glob("rank-*.json")}
        (document,) = documents.values()
        placed[document["rank"]] = (document["node"], document["instance"], document["node_rank"], document["ended"])
    instance_type = demo_config.training.sagemaker_instance_type
    assert placed == {0: ("algo-1", instance_type, 0, "finished"), 1: ("algo-2", instance_type, 1, "finished")}

    # Rank 0 uploads its node's directory; algo-2's node leader, seeing no rank 0 there, uploads its own node's.
    listed = deployed.client("s3").list_objects_v2(
        Bucket=BUCKET, Prefix=contract.run_prefix(EXPERIMENT, run) + "ranks/"
    )
    keys = {item["Key"].split("/ranks/", 1)[1] for item in listed.get("Contents", [])}
    assert "attempt-00000/rank-00000.json" in keys and "attempt-00000/node-00001/rank-00001.json" in keys, keys
    assert not any(key.startswith("attempt-00000/node-00001/rank-00000") for key in keys)


def test_a_rerun_of_a_run_on_sagemaker_is_a_job_of_its_own_and_the_doctor_reads_the_newest(
    deployed: DeployedTeam, sagemaker: SageMakerStandIn, tmp_path: Path
) -> None:
    """SageMaker never reuses a training job's name, and a run resumes under its own id: the second
    `beacon run --run R` is job `<prefix>R-R1` (the stand-in refuses a used name as SageMaker does), and
    `beacon doctor --run R --target sagemaker` reads that one."""
    run = "plain-ddp-again"
    for attempt in range(2):
        done = run_cli(
            deployed,
            *("--target", "sagemaker", "--image", ":v1", "--experiment", EXPERIMENT, "--run", run),
            *("--report", str(tmp_path / f"report-{attempt}.json")),
            command=TEAM_JOB,
            env={"AWS_ENDPOINT_URL_SAGEMAKER": sagemaker.url},
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    first, second = (read_report(tmp_path / f"report-{n}.json")["launched"]["training_job"] for n in range(2))
    assert first == names.training_job_name(TEAM, run) and second == f"{first}-R1"
    assert sorted(sagemaker.jobs) == [first, second] and sagemaker.calls.count("CreateTrainingJob") == 3
    doctor = deployed.cli("--run", run, "--experiment", EXPERIMENT, "--target", "sagemaker", "--json", verb="doctor",
                          extra_env={"AWS_ENDPOINT_URL_SAGEMAKER": sagemaker.url}, timeout=120)  # fmt: skip
    assert doctor.returncode in (0, 1), doctor.stdout[-2000:] + doctor.stderr[-2000:]
    assert json.loads(doctor.stdout)["training_job"]["name"] == second


def test_a_rerun_waits_for_the_runs_earlier_job_to_end() -> None:
    """Two jobs of one run at once would write one spool and one run's records: a used name whose job still runs
    stops the rerun, naming the job; one that ended lets the next name go."""
    from botocore.exceptions import ClientError

    from beacon_ops.jobs.sagemaker import first_free

    taken = ClientError({"Error": {"Code": "ResourceInUse", "Message": "names must be unique"}}, "CreateTrainingJob")
    made: list[str] = []

    def create(name: str) -> str:
        if name in ("demo-run-r", "demo-run-r-R1"):
            raise taken
        made.append(name)
        return name

    assert first_free(["demo-run-r", "demo-run-r-R1", "demo-run-r-R2"], create, lambda _n: "Stopped") == "demo-run-r-R2"
    with pytest.raises(JobError, match=r"training job demo-run-r-R1 of this run is InProgress; rerun it once it ended"):
        first_free(
            ["demo-run-r", "demo-run-r-R1", "demo-run-r-R2"],
            create,
            lambda n: "Failed" if n == "demo-run-r" else "InProgress",
        )
    assert made == ["demo-run-r-R2"]


def test_a_runs_sagemaker_jobs_are_named_apart_from_every_other_runs() -> None:
    """Reruns carry an uppercase mark no run id has: `r` and its reruns never meet `r-r1`'s jobs. A new run id
    leaves room for 99 reruns; one from before reruns, too long for the mark, still names its first job."""
    assert names.training_job_names(TEAM, "r")[:3] == ["demo-run-r", "demo-run-r-R1", "demo-run-r-R2"]
    assert not set(names.training_job_names(TEAM, "r")) & set(names.training_job_names(TEAM, "r-r1"))
    limit = names.TRAINING_JOB_NAME_LIMIT - len(names.training_job_prefix(TEAM))
    assert names.training_job_names(TEAM, "a" * limit) == [f"demo-run-{'a' * limit}"]
    with pytest.raises(JobError, match=r"--run: run 'a+': a SageMaker job of team 'demo' takes a run id of at most 50"):
        from beacon_ops.jobs.team import check_request

        check_request(TeamJobRequest(image=":v1", command=TEAM_JOB, run="a" * 52, target="sagemaker"), load_team(TEAM))
