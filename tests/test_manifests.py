"""The smoke Job builder shared by the stack and `beacon smoke`: single- and multi-node, CPU and GPU."""

from __future__ import annotations

import dataclasses
import re

import kubernetes_validate
import pytest
from beacon import contract

from config import load_team
from workloads import manifests

BASE = manifests.SmokeJobSpec(
    team="demo",
    image="123456789012.dkr.ecr.us-east-1.amazonaws.com/beacon:abc",
    bucket="bucket",
    region="us-east-1",
    uid=1000,
    gid=1000,
)


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("gpu", [False, True])
def test_every_variant_validates_strictly(nodes: int, gpu: bool) -> None:
    for item in manifests.smoke_job(dataclasses.replace(BASE, nodes=nodes, gpu=gpu, processes_per_node=2)):
        kubernetes_validate.validate(item, "1.35.0", strict=True)


def test_one_node_runs_standalone_without_a_service() -> None:
    (job,) = manifests.smoke_job(BASE)
    (train,) = job["spec"]["template"]["spec"]["containers"]
    assert train["command"] == ["python", "-m", "beacon.launch"] and train["args"][0] == "--standalone"
    assert "subdomain" not in job["spec"]["template"]["spec"]


def test_two_nodes_are_an_indexed_job_rendezvousing_on_index_0_through_a_headless_service() -> None:
    spec = dataclasses.replace(BASE, nodes=2)
    job, service = manifests.smoke_job(spec)
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] == spec.service_name
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": spec.name}
    args = pod["containers"][0]["args"]
    assert "--nnodes=2" in args and "--node-rank=$(JOB_COMPLETION_INDEX)" in args
    assert f"--master-addr={spec.name}-0.{spec.service_name}.training.svc" in args


def test_gpu_runs_tolerate_the_gpu_taint_and_request_gpus() -> None:
    (job,) = manifests.smoke_job(dataclasses.replace(BASE, gpu=True, processes_per_node=4))
    pod = job["spec"]["template"]["spec"]
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule", "operator": "Equal"}
    ]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert pod["nodeSelector"] == {"beacon/pool": "gpu-training"}


def test_the_name_changes_with_the_settings_and_the_image_suffix() -> None:
    assert dataclasses.replace(BASE, steps=201).name != BASE.name
    assert dataclasses.replace(BASE, name_suffix="-aa").name != BASE.name
    assert dataclasses.replace(BASE, image="other").name == BASE.name  # the suffix carries the image


def test_preflight_and_bad_input_fail_the_job_at_once() -> None:
    (job,) = manifests.smoke_job(BASE)
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert {"action": "FailJob", "onExitCodes": {"containerName": "train", "operator": "In", "values": [2, 3]}} in rules


def test_the_sagemaker_job_runs_the_same_entry_point_and_settings_with_sagemakers_paths() -> None:
    (job,) = manifests.smoke_job(BASE)
    (train,) = job["spec"]["template"]["spec"]["containers"]
    container = manifests.sagemaker_container(BASE)
    assert container.entrypoint == train["command"]
    # The same torchrun arguments, but each instance fills in its own rendezvous (beacon.launch).
    assert container.arguments == [contract.SAGEMAKER_RENDEZVOUS, *train["args"][1:]]
    assert train["args"][0] == "--standalone"
    on_eks = {e["name"]: e["value"] for e in train["env"] if "value" in e}
    differing = {k for k in on_eks if on_eks[k] != container.environment[k]}
    on_the_volume = {
        "BEACON_SPOOL_DIR",
        "BEACON_CHECKPOINT_DIR",
        "TORCH_FR_DUMP_TEMP_FILE",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    }
    assert differing == {*on_the_volume, "BEACON_HEARTBEAT_FILE"}, "only paths differ: SageMaker's volume is elsewhere"
    assert container.environment["BEACON_SPOOL_DIR"] == f"{manifests.SAGEMAKER_VOLUME}/spool"
    assert container.checkpoint_s3_uri == f"s3://bucket/experiments/smoke/{BASE.name}/sagemaker-volume/"


def test_a_multi_node_sagemaker_job_leaves_each_instance_its_own_rendezvous() -> None:
    """Every instance runs the same arguments: the node count and node rank are each instance's to fill in."""
    container = manifests.sagemaker_container(dataclasses.replace(BASE, nodes=2, processes_per_node=4))
    assert container.arguments[:2] == [contract.SAGEMAKER_RENDEZVOUS, "--nproc-per-node=4"]
    assert not any(a.startswith(("--nnodes", "--node-rank", "--master-addr")) for a in container.arguments)


def test_the_smoke_job_from_a_team_file_lasts_long_enough_for_its_run_alarms() -> None:
    config = load_team("demo")
    spec = manifests.smoke_job_spec(config, image="i", bucket="b", region="us-east-1")
    (job,) = manifests.smoke_job(spec)
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    # Two 30 s periods (the first heartbeat's, then one evaluated) and one more beat.
    assert float(env["BEACON_MIN_DURATION"]) == 2 * contract.HEARTBEAT_PERIOD_S + spec.heartbeat_interval
    assert env["BEACON_STEPS"] == str(config.training.smoke_steps)


def test_a_teams_slow_rank_share_reaches_its_jobs_on_eks_and_sagemaker_and_a_bad_one_is_named() -> None:
    """The team file's monitoring.slow_rank_share becomes each run's BEACON_SLOW_RANK_SHARE: its heartbeat and its
    preflight record (which the doctor reads) say the share its slow alarm was synthesized with."""
    config = load_team("demo")
    config = config.model_copy(update={"monitoring": config.monitoring.model_copy(update={"slow_rank_share": 0.4})})
    spec = manifests.smoke_job_spec(config, image="i", bucket="b", region="us-east-1")
    (job,) = manifests.smoke_job(spec)
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    assert env["BEACON_SLOW_RANK_SHARE"] == "0.4"
    assert manifests.sagemaker_container(spec).environment["BEACON_SLOW_RANK_SHARE"] == "0.4"
    with pytest.raises(ValueError, match=r"slow_rank_share: must be a share of the step from 0.1 to 0.9, got 25"):
        dataclasses.replace(BASE, slow_rank_share=25).training_job()


TEAM_JOB = manifests.TrainingJobSpec(
    team="vision",
    image="123456789012.dkr.ecr.us-east-1.amazonaws.com/beacon-vision:v7",
    bucket="beacon-vision-artifacts",
    region="us-east-1",
    uid=1000,
    gid=1000,
    name="resnet-0412",
    command=("train.py", "--epochs", "3"),
    experiment="resnet",
    nodes=2,
    processes_per_node=8,
    gpu=True,
    shutdown_budget=90,
    environment=(("BEACON_CLOUDWATCH_METRICS", "lr"),),
)


def test_a_team_job_gets_every_safety_setting_for_its_own_image_and_command() -> None:
    job, service = manifests.training_job(TEAM_JOB)
    for item in (job, service):
        kubernetes_validate.validate(item, "1.35", strict=True)
    pod = job["spec"]["template"]["spec"]
    (train,) = pod["containers"]
    assert train["image"] == TEAM_JOB.image and pod["initContainers"][0]["image"] == TEAM_JOB.image
    assert train["command"] == manifests.LAUNCH_COMMAND
    assert train["args"][-3:] == ["train.py", "--epochs", "3"], "torchrun runs the team's script"
    assert "--nnodes=2" in train["args"] and "--nproc-per-node=8" in train["args"]
    assert job["spec"]["completionMode"] == "Indexed" and service["spec"]["clusterIP"] == "None"
    assert pod["subdomain"] == service["metadata"]["name"]
    context = pod["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (1000, 1000, 1000)
    assert pod["terminationGracePeriodSeconds"] > TEAM_JOB.shutdown_budget, "the drain fits the grace period"
    assert job["spec"]["template"]["metadata"]["annotations"][manifests.DO_NOT_DISRUPT] == "true"
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert any(r["action"] == "FailJob" for r in rules) and any(r["action"] == "Ignore" for r in rules)
    probes = " ".join(train["livenessProbe"]["exec"]["command"] + train["startupProbe"]["exec"]["command"])
    assert all(path in probes for path in manifests.liveness_files(8)), "every local rank's own liveness file"
    env = {e["name"]: e["value"] for e in train["env"] if "value" in e}
    assert env["BEACON_RUN_ID"] == "resnet-0412" and env["BEACON_EXPERIMENT"] == "resnet"
    assert env["BEACON_BUCKET"] == TEAM_JOB.bucket and env["BEACON_CLOUDWATCH_METRICS"] == "lr"
    assert env["BEACON_SPOOL_DIR"].startswith(manifests.ARTIFACTS_MOUNT)
    assert train["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_the_smoke_job_is_a_training_job_of_the_smoke_command() -> None:
    (job,) = manifests.smoke_job(BASE)
    (same,) = manifests.training_job(BASE.training_job())
    assert job == same
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][-2:] == list(manifests.SMOKE_COMMAND)


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"name": "Not_A_Name"}, "name 'Not_A_Name'"),
        ({"name": "x" * 53}, "name 'xxx"),
        ({"command": ()}, "command: empty"),
        ({"nodes": 0}, "nodes: must be >= 1"),
    ],
)
def test_a_team_job_with_bad_settings_is_refused_naming_the_field(change: dict[str, object], names: str) -> None:
    with pytest.raises(ValueError, match=re.escape(names)):
        dataclasses.replace(TEAM_JOB, **change)  # type: ignore[arg-type]


def test_every_rank_knows_its_pod_and_node_and_keeps_its_flight_recorder_under_the_run() -> None:
    """The downward API gives each rank its pod and node for its progress signal; the flight
    recorder dumps beside it, on the shared volume, when a collective times out."""
    job, _service = manifests.smoke_job(dataclasses.replace(BASE, nodes=2))
    (train,) = job["spec"]["template"]["spec"]["containers"]
    fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in train["env"] if "valueFrom" in e}
    assert fields == {"BEACON_POD_NAME": "metadata.name", "BEACON_NODE_NAME": "spec.nodeName"}
    env = {e["name"]: e["value"] for e in train["env"] if "value" in e}
    ranks = f"{manifests.ARTIFACTS_MOUNT}/spool/{env['BEACON_EXPERIMENT']}/{env['BEACON_RUN_ID']}/ranks/"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == env["TORCH_FR_DUMP_TEMP_FILE"] == ranks + "flight-recorder-rank-"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and int(env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0


def test_a_rank_whose_c_call_holds_the_gil_dumps_its_stacks_before_the_liveness_probe_gives_up() -> None:
    """A C call holding the GIL stops every Python thread: the rank's signal thread, and the thread touching its
    liveness file. faulthandler's watchdog (a C thread) dumps `stall_dump_after` plus one pass after the signal
    thread last ran; the probe fails `HEARTBEAT_TOLERANCE_S` after the file was last touched (which is no earlier):
    the dump must come first, or the kill takes the evidence with it."""
    from beacon.evidence.ranks import rank_signal_interval

    for heartbeat in (1.0, 15.0, 60.0):
        watchdog = contract.STALL_THRESHOLD_S + rank_signal_interval(heartbeat)
        assert watchdog < manifests.HEARTBEAT_TOLERANCE_S, (heartbeat, watchdog)


def test_beacon_run_gives_a_teams_job_its_team_files_slow_rank_share() -> None:
    from beacon_ops.jobs.flow import TeamOutputs
    from beacon_ops.jobs.team import TeamJobRequest, team_job

    config = load_team("demo")
    config = config.model_copy(update={"monitoring": config.monitoring.model_copy(update={"slow_rank_share": 0.4})})
    outputs = TeamOutputs("demo", "us-east-1", "b", "w", "r", "k", "beacon-demo", "training", "i", "repo", "t", "p", ())
    spec = team_job(TeamJobRequest(image="repo:v1", command=("train.py",)), config, outputs)
    assert spec.slow_rank_share == 0.4
