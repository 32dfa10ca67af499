"""`make destroy` while a GPU job runs (issue 25, item 11): the team's Jobs are stopped first and their pods waited
for, a bounded time; what still runs then is one line saying how to end it. The rest of `beacon_ops.teardown`
(order, what remains) is in test_makefile.py.

The fake Kubernetes API runs the Job's real process: deleting the Job sends it SIGTERM, and it drains."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any

import boto3
import pytest
from beacon import contract

from beacon_ops.jobs.drain import drain_cluster
from beacon_ops.jobs.eks import cluster_api
from config import TeamConfig, names
from tests.support.deployed_team import BUCKET, IMAGE, TEAM, DeployedTeam
from tests.support.fake_kubernetes import FakeKubernetes
from tests.support.job_harness import wait_for
from tests.support.moto_server import REGION
from tests.support.synth import ROOT
from workloads import manifests


def running_job(kubernetes: FakeKubernetes, demo_config: TeamConfig) -> str:
    """A training Job of the team, its pod's real process stepping."""
    spec = manifests.smoke_job_spec(demo_config, image=IMAGE, bucket=BUCKET, region=REGION, name_suffix="-drain")
    (job, *_) = manifests.smoke_job(dataclasses.replace(spec, steps=100_000))
    status, _ = kubernetes._create_job(contract.TRAINING_NAMESPACE, job)
    assert status == 201
    assert wait_for(lambda: kubernetes.running_processes() == 1, timeout=60)
    volume = kubernetes.workdir / "volume"
    assert wait_for(lambda: any(volume.rglob("state.json")), timeout=120), "the job is stepping"
    return str(job["metadata"]["name"])


def drain(deployed: DeployedTeam, kubernetes: FakeKubernetes) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "beacon_ops.jobs.drain", "--team", TEAM, "--kubernetes-url", kubernetes.url],
        cwd=ROOT, env=deployed.env(), capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def test_make_destroy_stops_a_running_job_first_within_an_operators_rights_and_goes_on_once_nothing_runs(
    deployed: DeployedTeam, kubernetes: FakeKubernetes, demo_config: TeamConfig
) -> None:
    job = running_job(kubernetes, demo_config)
    before = len(kubernetes.requests)
    done = drain(deployed, kubernetes)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stopping 1 Job(s) in training" in done.stdout
    assert kubernetes.jobs[(contract.TRAINING_NAMESPACE, job)].deleted and kubernetes.running_processes() == 0
    # An operator's rights are edit in the training namespace alone (its access entry): the drain asks nothing else
    asked = {path for _, path in kubernetes.requests[before:]}
    assert all(p.startswith(("/api/v1/namespaces/training/", "/apis/batch/v1/namespaces/training/")) for p in asked)
    # The job drained on SIGTERM: its final state says so, nothing of it lost to the destroy
    final = deployed.client("s3").get_object(Bucket=BUCKET, Key=contract.final_status_key("smoke", job))
    assert json.loads(final["Body"].read())["state"] == "preempted"


def test_a_refused_drain_is_one_line_naming_who_may_run_it(deployed: DeployedTeam, kubernetes: FakeKubernetes) -> None:
    kubernetes.forbidden.add(f"/apis/batch/v1/namespaces/{contract.TRAINING_NAMESPACE}/jobs")
    done = drain(deployed, kubernetes)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "answered 403 Forbidden" in line and "cluster.operator_role_arns" in line and "DRAIN=off" in line, line


def api_to(kubernetes: FakeKubernetes, deployed: DeployedTeam, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in deployed.env().items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    session = boto3.session.Session(region_name=REGION)
    return cluster_api(session, names.cluster_name(TEAM), REGION, url_override=kubernetes.url)


def test_what_still_runs_after_the_bound_is_one_line_saying_how_to_end_it(
    deployed: DeployedTeam, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod that outlives its Job's deletion (a finalizer, an unkillable process): waited for on an injected clock."""
    stuck = {"apiVersion": "v1", "kind": "Pod", "spec": {"nodeName": "ip-10-0-0-5.ec2.internal", "containers": []},
             "metadata": {"name": "train-abc", "namespace": contract.TRAINING_NAMESPACE, "labels": {}}}  # fmt: skip
    kubernetes.seed(pods=[stuck])
    clock, slept = [0.0], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    running = drain_cluster(api_to(kubernetes, deployed, monkeypatch), bound_s=600, poll_s=10,
                            clock=lambda: clock[0], sleep=sleep, show=lambda _: None)  # fmt: skip
    assert sum(slept) == 600 and running.pods == [("train-abc", "ip-10-0-0-5.ec2.internal")]
    assert running.line(TEAM, 600) == (
        "beacon destroy: still running after 600 s: training/train-abc (node ip-10-0-0-5.ec2.internal); end them "
        "with `kubectl -n training delete pod train-abc --grace-period=0 --force`, then `make destroy TEAM=demo` again"
    )


def test_the_makefile_drains_before_the_protection_is_lifted_and_any_stack_goes() -> None:
    recipe = subprocess.run(["make", "-n", "destroy", "TEAM=vision"], cwd=ROOT, capture_output=True, text=True).stdout
    lines = recipe.splitlines()
    drain = next(i for i, line in enumerate(lines) if "beacon_ops.jobs.drain --team vision" in line)
    prepare = next(i for i, line in enumerate(lines) if "beacon_ops.teardown prepare --team vision" in line)
    first_destroy = next(i for i, line in enumerate(lines) if "destroy --force --exclusively" in line)
    assert drain < prepare < first_destroy
    off = subprocess.run(["make", "-n", "destroy", "TEAM=vision", "DRAIN=off"], cwd=ROOT, capture_output=True,
                         text=True).stdout  # fmt: skip
    assert 'test "off" = off ||' in off
