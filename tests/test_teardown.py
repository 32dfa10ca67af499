"""`make destroy` while a GPU job runs (issue 25, item 11): the team's Jobs and NodePools are stopped first, a
bounded wait follows, and what still runs is one line saying how to end it. The rest of `beacon_ops.teardown`
(order, what remains) is in test_makefile.py.

The fake Kubernetes API runs the Job's real process (SIGTERM drains it), and its Karpenter removes a deleted
pool's NodeClaims once nothing runs; a claim whose finalizer never clears stands for a node whose do-not-disrupt
pod outlives the pool's 24 h termination grace period."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest
from beacon import contract

from beacon_ops.jobs.eks import cluster_api
from beacon_ops.teardown import drain_cluster
from config import TeamConfig, names
from tests.support.deployed_team import BUCKET, IMAGE, TEAM, DeployedTeam
from tests.support.fake_kubernetes import FakeKubernetes
from tests.support.job_harness import wait_for
from tests.support.moto_server import REGION
from tests.support.synth import ROOT
from workloads import manifests

POOLS = (manifests.GPU_POOL, manifests.CPU_POOL)


def karpenter_state(kubernetes: FakeKubernetes, *, stuck: tuple[str, ...] = ()) -> None:
    """The team's two NodePools, and a NodeClaim (a node) of each."""
    kubernetes.seed(
        node_pools=[{"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": p}} for p in POOLS],
        node_claims=[
            {
                "apiVersion": "karpenter.sh/v1",
                "kind": "NodeClaim",
                "metadata": {"name": f"{pool}-abcde", "labels": {"karpenter.sh/nodepool": pool}},
                "status": {"nodeName": f"ip-10-0-{i}-5.ec2.internal"},
            }
            for i, pool in enumerate(POOLS)
        ],
        stuck=stuck,
    )


def running_job(kubernetes: FakeKubernetes, demo_config: TeamConfig) -> str:
    """A training Job of the team, its pod's real process stepping."""
    spec = manifests.smoke_job_spec(demo_config, image=IMAGE, bucket=BUCKET, region=REGION, name_suffix="-drain")
    (job, *_) = manifests.smoke_job(dataclasses.replace(spec, steps=100_000))
    status, _ = kubernetes._create_job(contract.TRAINING_NAMESPACE, job)
    assert status == 201
    name = job["metadata"]["name"]
    assert wait_for(lambda: kubernetes.running_processes() == 1, timeout=60)
    volume = kubernetes.workdir / "volume"
    assert wait_for(lambda: any(volume.rglob("state.json")), timeout=120), "the job is stepping"
    return str(name)


def test_make_destroy_stops_a_running_job_and_the_pools_first_and_goes_on_once_nothing_runs(
    deployed: DeployedTeam, kubernetes: FakeKubernetes, demo_config: TeamConfig
) -> None:
    karpenter_state(kubernetes)
    job = running_job(kubernetes, demo_config)
    done = subprocess.run(
        [sys.executable, "-m", "beacon_ops.teardown", "drain", "--team", TEAM, "--kubernetes-url", kubernetes.url],
        cwd=ROOT, env=deployed.env(), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stopping 1 Job(s) in training and 2 NodePool(s)" in done.stdout
    assert kubernetes.jobs[(contract.TRAINING_NAMESPACE, job)].deleted and kubernetes.running_processes() == 0
    assert kubernetes.node_pools == {} and kubernetes.node_claims == {}, "Karpenter drained and terminated the nodes"
    # The job drained on SIGTERM: its final state says so, so nothing of it was lost to the destroy
    final = deployed.client("s3").get_object(Bucket=BUCKET, Key=contract.final_status_key("smoke", job))
    assert json.loads(final["Body"].read())["state"] == "preempted"


def api_to(kubernetes: FakeKubernetes, deployed: DeployedTeam, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in deployed.env().items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    session = boto3.session.Session(region_name=REGION)
    return cluster_api(session, names.cluster_name(TEAM), REGION, url_override=kubernetes.url)


def test_what_still_runs_after_the_bound_is_one_line_saying_how_to_end_it(
    deployed: DeployedTeam, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU node whose do-not-disrupt pod outlives the pool's grace period: its NodeClaim's finalizer holds, and the
    EC2NodeClass's deletion would wait past the kubectl handler's 15 minutes. Waited for on an injected clock."""
    karpenter_state(kubernetes, stuck=(f"{manifests.GPU_POOL}-abcde",))
    clock, slept = [0.0], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    running = drain_cluster(api_to(kubernetes, deployed, monkeypatch), bound_s=600, poll_s=10,
                            clock=lambda: clock[0], sleep=sleep, show=lambda _: None)  # fmt: skip
    assert sum(slept) == 600 and running.node_claims == [(f"{manifests.GPU_POOL}-abcde", "ip-10-0-0-5.ec2.internal")]
    assert running.pods == [] and kubernetes.node_pools == {}
    line = running.line(TEAM, 600)
    assert line == (
        "beacon destroy: still running after 600 s: nodeclaim gpu-training-abcde (node ip-10-0-0-5.ec2.internal); "
        "end them with `kubectl delete nodeclaim gpu-training-abcde`, then `make destroy TEAM=demo` again"
    )


def test_the_makefile_drains_before_any_stack_goes_unless_told_not_to(tmp_path: Path) -> None:
    recipe = subprocess.run(["make", "-n", "destroy", "TEAM=vision"], cwd=ROOT, capture_output=True, text=True).stdout
    lines = recipe.splitlines()
    drain = next(i for i, line in enumerate(lines) if "beacon_ops.teardown drain --team vision" in line)
    first_destroy = next(i for i, line in enumerate(lines) if "destroy --force --exclusively" in line)
    assert drain < first_destroy
    off = subprocess.run(["make", "-n", "destroy", "TEAM=vision", "DRAIN=off"], cwd=ROOT, capture_output=True,
                         text=True).stdout  # fmt: skip
    assert 'test "off" = off ||' in off
