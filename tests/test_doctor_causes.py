"""Which verdict leads when the orchestrator and the run's own evidence both speak: the run's own last word
says more than a bare exit code, and a run that never started is waiting for its node, not silent."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from beacon_ops.doctor.diagnosis import Diagnosis, DoctorInputs, diagnose
from beacon_ops.doctor.orchestrator import OrchestratorState, job_state
from beacon_ops.evidence.reading import RunEvidence
from tests.support.moto_server import REGION, MotoServer
from tests.test_doctor_orchestrator import NS, beacon_job, event, pod, unschedulable

FAILED = {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": "2026-12-01T10:00:00Z"}}
PREFLIGHT = {"host": "train-0", "started_at": "2026-12-01T10:00:05+00:00", "spool_dir": "/artifacts/spool"}


def diagnosed(moto_server: MotoServer, run: str, state: OrchestratorState, evidence: RunEvidence) -> Diagnosis:
    moto_server.client("s3").create_bucket(Bucket="causes")
    inputs = DoctorInputs(
        team="demo",
        experiment="smoke",
        run=run,
        bucket="causes",
        region=REGION,
        s3=moto_server.client("s3"),
        cloudwatch=moto_server.client("cloudwatch"),
        orchestrator=state,
    )
    return diagnose(inputs, evidence=evidence)


def cluster_state(job: dict[str, Any], pods: list[dict[str, Any]], events: list[dict[str, Any]]) -> OrchestratorState:
    name = job["metadata"]["name"]
    return OrchestratorState("eks", "demo", NS, name, datetime.now(UTC), job=job_state(job, pods, events))


def test_the_runs_own_exception_leads_the_containers_bare_exit_code(moto_server: MotoServer) -> None:
    job = beacon_job("raised", active=0, failed=1)
    state = cluster_state(job, [pod(job, "0-r4e3w", phase="Failed", state=FAILED)], [])
    evidence = RunEvidence(
        "smoke", "raised", preflights=[{**PREFLIGHT, "spool_persistent": True, "spool_filesystem": "nfs4"}]
    )
    evidence.final = {"state": "failed", "error": "ValueError: bad shape (3, 4)", "last_step": 41}
    result = diagnosed(moto_server, "raised", state, evidence)
    assert (result.diagnosis, result.lead) == ("failed", "job"), [
        (v.check, v.status, v.verdict) for v in result.verdicts
    ]
    assert result.headline() == "failed: the run failed at step 41: ValueError: bad shape (3, 4)"


def test_a_run_that_never_started_while_its_pod_waits_for_a_node_is_waiting_not_silent(
    moto_server: MotoServer,
) -> None:
    job = beacon_job("queued", active=1)
    waiting = unschedulable(job, "0-q1a2z", "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")
    nominated = event(
        "Pod", "queued-0-q1a2z", "Nominated", "Pod should schedule on: nodeclaim/gpu-x7", "2026-12-01T10:00:09Z",
        source="karpenter", kind_type="Normal",
    )  # fmt: skip
    result = diagnosed(
        moto_server, "queued", cluster_state(job, [waiting], [nominated]), RunEvidence("smoke", "queued")
    )
    assert (result.diagnosis, result.lead) == ("waiting-for-node", "orchestrator"), result.headline()
    assert "nodeclaim/gpu-x7" in result.headline()
