"""The documentation site (docs/, mkdocs.yml): it builds strictly (a broken link or a page left out of the
navigation fails), and what its pages state about the code is checked against the code."""

from __future__ import annotations

import dataclasses
import html
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from beacon import contract
from beacon.contract.preflight import PreflightRecord
from beacon.contract.rank_evidence import FLIGHT_RECORDER_PREFIX, RankProgress, rank_document_name, stacks_name
from beacon.settings import RunSettings

from beacon_ops.cli import reference
from beacon_ops.doctor.diagnosis import Diagnosis, DoctorInputs, diagnose
from beacon_ops.doctor.flight_recorder import FlightRecorderReading, Mismatch
from beacon_ops.evidence.reading import RunEvidence
from tests.conftest import WriterSession
from tests.support.metric_history import sent_every_beat
from tests.support.synth import ROOT

SETTINGS_PAGE = ROOT / "docs" / "runtime" / "settings.md"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `make docs` builds it, strictly, once for this file's tests."""
    built = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(built)],
        cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return built


def test_the_site_builds_strictly(site: Path) -> None:
    assert (site / "runtime" / "settings" / "index.html").is_file()
    assert (site / "cli" / "index.html").is_file()


def test_the_cli_reference_is_every_subcommand_and_option_of_the_real_command(site: Path) -> None:
    """docs/cli.md is generated from the command's click group: a command or option added, renamed or dropped
    shows there at the next build."""
    page = html.unescape((site / "cli" / "index.html").read_text())
    sections = re.findall(r'<h3 id="([\w-]+)"', page)
    assert sections == sorted(reference.command.commands)  # type: ignore[attr-defined]
    assert {"smoke", "run", "doctor", "local", "sync", "tensorboard", "goodput"} <= set(sections)
    for name, command in reference.command.commands.items():  # type: ignore[attr-defined]
        section = page.split(f'<h3 id="{name}"', 1)[1].split("<h3 ", 1)[0]
        assert f"beacon {name} [OPTIONS]" in section, name
        shown = [param for param in command.params if not getattr(param, "hidden", False)]
        for option in (opt for param in shown for opt in param.opts if opt.startswith("--")):
            assert option in section, f"beacon {name} {option}"


def shown_default(value: object) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value in ("", ()):
        return "empty"
    return f"`{value}`"


def test_the_settings_table_is_every_setting_with_its_variable_and_default() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `(BEACON_\w+)` \| ([^|]+) \|", SETTINGS_PAGE.read_text(), re.MULTILINE)
    table = [(name, variable, default.strip()) for name, variable, default in rows]
    expected = [
        (f.name, "BEACON_RUN_ID" if f.name == "run" else f"BEACON_{f.name.upper()}", shown_default(f.default))
        for f in dataclasses.fields(RunSettings)
    ]
    assert table == expected
    for setting in dataclasses.fields(RunSettings):  # each variable named is the one that sets it
        variable = next(v for name, v, _ in table if name == setting.name)
        resolved = RunSettings.resolve({"BEACON_BUCKET": "b", variable: another_value(setting.name, setting.default)})
        assert getattr(resolved, setting.name) != setting.default, variable


def another_value(name: str, default: object) -> str:
    """A valid value other than the default, as text in the environment."""
    if name == "wandb_mode":
        return "offline"
    if name == "slow_rank_share":  # a share of the step
        return "0.4"
    if isinstance(default, bool):
        return str(not default).lower()
    if isinstance(default, int | float):
        return str(default * 2 + 1)
    if isinstance(default, tuple):
        return "wandb" if name == "mirrors" else "loss,lr"
    return "/elsewhere" if isinstance(default, Path) else "other-1"


def text_blocks(page: Path) -> list[str]:
    return [block.strip() for block in re.findall(r"```text\n(.*?)```", page.read_text(), re.DOTALL)]


# Runs the doctor answers with each verdict, written as their job writes them (records, preflights, final state,
# metrics), each named by what the doctor says first (after the comma: which example of it); `doctor`: what the
# doctor is given besides (a probe identity, an S3 it cannot reach or that answers slowly, another bucket).
WARNINGS = {contract.NON_FINITE_LOSS: 3.0, contract.CHECKPOINTS_SKIPPED: 1.0, contract.STEPS_SINCE_CHECKPOINT: 40.0,
            contract.UPLOAD_FAILURES: 2.0, contract.SPOOL_BACKLOG: 12.0}  # fmt: skip
# fmt: off
VERDICT_RUNS: dict[str, dict[str, Any]] = {
    "healthy": {"final": None, "beats": 2.0},  # heartbeats go on, a step 2 s before the last one
    "healthy, with warnings": {
        "final": None,
        "beats": 2.0,
        "metrics": WARNINGS,
        "hosts": ("train-0", "train-1"),
        "doctor": {"alarm": True},
    },
    "failed": {"final": {"state": "failed", "error": "RuntimeError"}},
    "preempted": {"final": {"state": "preempted", "signal": "SIGTERM"}},
    "silent": {"final": None},
    "stalled": {"final": None, "beats": 200.0},  # heartbeats go on, its progress age grows
    # no step for 45 s at 1 s steps: past the 30 s its pace allows (its document says), short of the 90 s of a stall
    "paused": {"final": None, "beats": 45.0, "paced": True},
    "permission": {"final": None, "beats": 2.0, "doctor": {"probe": "reader"}},  # the probe may not write
    "spool-not-persistent": {"final": None, "persistent": False},
    "rank-collision": {"final": {"state": "finished"}, "ranks": (0, 1)},
    "delivery": {"final": {"state": "finished"}, "lost": (1,)},  # the second of three chunks never reached S3
    "delivery, behind": {
        "final": None,
        "beats": 2.0,
        "metrics": {contract.UPLOAD_FAILURES: 40.0, contract.SPOOL_BACKLOG: 900.0},
    },
    # rank 0's live snapshot while rank 2 is waited for, and its heartbeat saying so
    "rank-slow": {"final": None, "beats": 2.0, "slow_rank": 2, "history": {contract.STRAGGLER_WAIT_SHARE: 0.33}},
    # every rank 1.7x slower than the run's baseline for ten minutes, its heartbeat says (StepTimeRatio), none apart
    "run-slowed": {"final": None, "beats": 2.0, "history": {contract.STEP_TIME_RATIO: 1.7}},
    "endpoint": {"final": {"state": "finished"}, "region": "eu-west-1"},
    "unreachable": {"final": {"state": "finished"}, "doctor": {"s3": "nowhere", "probe": "nowhere"}},
    "finished, slowly": {"final": {"state": "finished"}, "doctor": {"s3": "slow"}},
    "not-readable": {"final": None, "doctor": {"bucket": "another-teams-bucket"}},  # its reader may not list it
    "no-bucket": {"final": None, "doctor": {"bucket": "no-such-bucket", "admin": True}},  # one who may list any
}
# fmt: on


def seed_run(
    as_writer: WriterSession,
    run: str,
    *,
    final: dict[str, Any] | None,
    ranks: tuple[int, ...] = (0,),
    persistent: bool = True,
    beats: float | None = None,
    lost: tuple[int, ...] = (),  # chunks
    region: str = "us-east-1",
    metrics: dict[contract.Metric, float] | None = None,
    hosts: tuple[str, ...] = ("train-0",),
    slow_rank: int | None = None,
    paced: bool = False,
    history: dict[contract.Metric, float] | None = None,
) -> datetime | None:
    """30 steps of `run` in S3 as its writer wrote them, from each of `ranks`, in chunks of 10 records less those
    numbered `lost`; a preflight (in `region`) from each of `hosts`; its final state, or none; with `beats`, a
    heartbeat 20 s ago whose progress age says no step for that many seconds, and `metrics` beside it (`history`:
    sent by every beat of the last ten minutes). The moment to read it at (None: now)."""
    s3, bucket, now = as_writer.client("s3"), as_writer.bucket, time.time()
    steps = enumerate((step, rank) for step in range(30) for rank in ranks)
    lines = [contract.Record("smoke", run, s, {"loss": 2.0 / (s + 1)}, now - 60 + s, seq=seq, rank=r).to_line()
             for seq, (s, r) in steps]  # fmt: skip
    for chunk in set(range(0, len(lines), 10)) - {10 * c for c in lost}:
        s3.put_object(Bucket=bucket, Key=contract.events_key("smoke", run, chunk // 10),
                      Body=b"".join(lines[chunk : chunk + 10]))  # fmt: skip
    for number, host in enumerate(hosts):
        preflight = PreflightRecord(
            run=run, experiment="smoke", host=host, pid=100, world_size=1 if slow_rank is None else 4, team="demo",
            region=region,
            spool_dir="/artifacts/spool" if persistent else "/tmp/spool", spool_persistent=persistent,
            spool_filesystem="nfs4" if persistent else "tmpfs", started_at=f"2026-12-01T1{number}:00:00+00:00",
            namespace=contract.metric_namespace("demo"),
            s3_endpoint="https://s3.us-east-1.amazonaws.com", heartbeat_interval=15.0,
        )  # fmt: skip
        s3.put_object(
            Bucket=bucket,
            Key=contract.preflight_key("smoke", run, f"{number + 1}-abc.json"),
            Body=json.dumps(dataclasses.asdict(preflight)),
        )
    if paced:  # rank 0's files, as its own live snapshot took them once its progress passed its pace's threshold
        document = RankProgress(0, 0, 1, 2999, "training", 35.0, now - 10, now - 45, 1, "train-0", "node-0", "", 1,
                                pace_steps=600, pace_window_s=301.0, pace_step_s=1.0, stall_after_s=30.0)  # fmt: skip
        dump = stall_dump(0, 2999, "/app/train.py 131 evaluate", "/app/train.py 88 main", at=now - 14)
        for name, content in ((rank_document_name(0), json.dumps(dataclasses.asdict(document)).encode()),
                           (stacks_name(0), dump.replace(b"95 s", b"31 s")),
                           (contract.LIVE_SNAPSHOT_COMPLETE, b"")):  # fmt: skip
            s3.put_object(Bucket=bucket, Key=contract.live_rank_evidence_key("smoke", run, 0, 0, name), Body=content)
    if slow_rank is not None:  # four ranks' documents as rank 0 uploads them while one is slow (`run.watch`)
        for rank in range(4):
            document = RankProgress(
                rank, rank % 2, 4, 29, "training", 0.5, now - 10, now - 10.5, 1, f"train-{rank // 2}",
                f"node-{rank // 2}", "", 0, pace_steps=198, pace_window_s=301.0, pace_step_s=1.52,
                pace_wait_s=0.01 if rank == slow_rank else 0.51,
            )  # fmt: skip
            key = contract.live_rank_evidence_key("smoke", run, 0, 0, rank_document_name(rank))
            s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(dataclasses.asdict(document)))
        complete = contract.live_rank_evidence_key("smoke", run, 0, 0, contract.LIVE_SNAPSHOT_COMPLETE)
        s3.put_object(Bucket=bucket, Key=complete, Body=b"")
    if final is not None:
        body = {"attempt": 0, "last_step": 29, "ended_at": now, "unacknowledged_records": 0, **final}
        s3.put_object(Bucket=bucket, Key=contract.final_status_key("smoke", run), Body=json.dumps(body))
    if beats is None:
        return None
    beat = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=20)
    dimensions = [{"Name": k, "Value": v} for k, v in contract.run_dimensions("demo", "smoke", run).items()]
    sent = {contract.HEARTBEAT: 1.0, contract.PROGRESS_AGE: beats, contract.STEP: 29.0, **(metrics or {})}
    as_writer.client("cloudwatch").put_metric_data(Namespace=contract.metric_namespace("demo"), MetricData=[
        {"MetricName": metric.name, "Dimensions": dimensions, "Value": value, "Unit": metric.unit.value,
         "Timestamp": beat, "StorageResolution": 1}
        for metric, value in sent.items()
    ])  # fmt: skip
    for metric, value in (history or {}).items():
        sent_every_beat(as_writer.client("cloudwatch"), "demo", "smoke", run, metric, value, until=beat)
    return beat + timedelta(seconds=5)


class SlowS3:
    """The reader's S3 client, answering a listing a little over the doctor's one-second mark for a slow endpoint."""

    def __init__(self, s3: Any) -> None:
        self._s3, self.meta = s3, s3.meta

    def list_objects_v2(self, **kwargs: Any) -> Any:
        time.sleep(1.05)
        return self._s3.list_objects_v2(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s3, name)


def alarm_of(as_writer: WriterSession, run: str) -> None:
    """The run's own alarms, as its job creates them, one of them in ALARM (set by the admin: moto evaluates none)."""
    from beacon.sinks.run_alarms import RunAlarms

    as_writer.aws.reset_auth_only()
    try:
        RunAlarms(as_writer.aws.client("cloudwatch"), as_writer.aws.client("ssm"), "demo", "smoke", run).arm()
        as_writer.aws.client("cloudwatch").set_alarm_state(
            AlarmName=contract.run_alarm_name("demo", "smoke", run, contract.RunAlarm.STALLED),
            StateValue="ALARM", StateReason="StallRatio at or above 1",
        )  # fmt: skip
    finally:
        as_writer.aws.enforce_iam()


def verdict_examples(as_writer: WriterSession) -> list[str]:
    """What the doctor says on each of `VERDICT_RUNS`: its first line, then each failing or warning check's fix."""
    import boto3
    from botocore.config import Config

    nowhere = boto3.client("s3", endpoint_url="http://127.0.0.1:9", region_name="us-east-1",
                           aws_access_key_id="x", aws_secret_access_key="y",
                           config=Config(retries={"max_attempts": 1}, connect_timeout=1))  # fmt: skip
    examples = []
    for name, run in VERDICT_RUNS.items():
        given = run.get("doctor", {})
        seeded = {key: value for key, value in run.items() if key != "doctor"}
        run_id = "example-" + name.replace(", ", "-").replace(" ", "-")
        at = seed_run(as_writer, run_id, **seeded)
        if given.get("alarm"):
            alarm_of(as_writer, run_id)
        reader = as_writer.client("s3", as_writer.reader)
        s3 = {"nowhere": nowhere, "slow": SlowS3(reader)}
        if given.get("admin"):
            as_writer.aws.reset_auth_only()
        inputs = DoctorInputs(
            team="demo", experiment="smoke", run=run_id, bucket=given.get("bucket", as_writer.bucket),
            region="us-east-1", s3=s3.get(given.get("s3", ""), reader),
            cloudwatch=as_writer.client("cloudwatch", as_writer.reader),
            probe_s3={"reader": reader, "nowhere": nowhere}.get(given.get("probe", "")), now=at,
        )  # fmt: skip
        try:
            diagnosis = diagnose(inputs)
        finally:
            as_writer.aws.enforce_iam()
        assert diagnosis.diagnosis == name.split(",")[0], diagnosis.headline()
        shown = [
            f"[{v.status}] {v.check}: {v.verdict}; fix: {v.fix}"
            for v in diagnosis.verdicts
            if v.status in ("fail", "warn")
        ]
        examples.append("\n".join([diagnosis.headline(), *shown]))
    return examples


def test_the_doctors_example_verdicts_are_what_it_says_on_such_a_run(as_writer: WriterSession) -> None:
    """Issue 27: the examples are produced, not written by hand."""
    from tests.test_hostile_evidence import diagnosed, ranks_key, seed_finished_run

    def shown(diagnosis: Diagnosis) -> str:
        (evidence,) = [v for v in diagnosis.verdicts if v.check == "evidence"]
        return f"{diagnosis.headline()}\n[{evidence.status}] evidence: {evidence.verdict}: {evidence.evidence}"

    seed_finished_run(as_writer)
    clean = diagnosed(as_writer)
    finished = shown(clean)
    as_writer.client("s3").put_object(Bucket=as_writer.bucket, Key=ranks_key(rank_document_name(1)), Body=b"[]")
    set_aside = shown(diagnosed(as_writer))
    page = ROOT / "docs" / "doctor.md"
    produced = [finished, set_aside, *verdict_examples(as_writer)]
    on_page = text_blocks(page)
    assert len(on_page) == len(produced), on_page
    for example, said in zip(on_page, produced, strict=True):
        assert example_shown(example, said), f"the page shows\n{example}\nthe doctor says\n{said}"
    listed = re.findall(r"^\| `(\w+)` \|", page.read_text(), re.MULTILINE)
    assert listed == [v.check for v in clean.verdicts], "the checks' table, in the order the doctor gives them"


# --- every verdict of the orchestrator, SageMaker and the logs on docs/doctor-reference.md --------------------------
REFERENCE_PAGE = ROOT / "docs" / "doctor-reference.md"


def orchestrator_examples() -> list[str]:
    """Each verdict of the EKS orchestrator check on a Job as the Kubernetes API serves it (the scenarios of
    tests/test_doctor_orchestrator.py), as `[status] verdict: evidence`."""
    from beacon_ops.doctor.orchestrator import OrchestratorState, job_state, orchestrator_verdict
    from tests import test_doctor_orchestrator as k
    from workloads import manifests

    gpu, t0, ns = k.GPU_NODE, k.T0, k.NS

    def placed(pod: str, at: str = t0) -> dict[str, Any]:
        return k.event("Pod", pod, "Scheduled", f"Successfully assigned {ns}/{pod} to {gpu}", at,
                       source="default-scheduler", kind_type="Normal")  # fmt: skip

    def waiting(reason: str, message: str = "") -> dict[str, Any]:
        return {"waiting": {"reason": reason, **({"message": message} if message else {})}}

    def ended(code: int, reason: str, at: str) -> dict[str, Any]:
        return {"terminated": {"exitCode": code, "reason": reason, "startedAt": t0, "finishedAt": at}}

    # fmt: off
    running = {"running": {"startedAt": t0}}
    spot = [k.event("Node", gpu, "SpotInterrupted", k.SPOT_MESSAGE, "2026-12-01T10:05:00Z", source="karpenter"),
            k.event("Pod", "spot-run-0-aaaaa", "Evicted", k.FORCEFUL, "2026-12-01T10:05:02Z", source="karpenter")]
    complete = [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-12-01T11:00:00Z"}]
    failed = [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "lastTransitionTime":
               "2026-12-01T12:00:00Z", "message": "Job was active longer than specified deadline"}]
    insufficient = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    killed = ended(137, "Error", "2026-12-01T10:20:00Z")
    evicted = k.pod(k.foreign_job("pressed"), "e5v6t", phase="Failed", state=killed)
    evicted["status"] |= {"reason": "Evicted", "message": "The node was low on resource: memory."}
    mount = ('MountVolume.SetUp failed for volume "beacon-artifacts" : rpc error: code = Internal desc = Could not '
             'mount "fs-0abc:/": mount failed: exit status 32: Connection timed out')
    old = k.karpenter_node(gpu, created="2026-11-01T09:00:00Z", deleting="2026-12-01T10:00:00Z")
    sick = k.karpenter_node(gpu, created=t0, deleting="2026-12-01T10:50:00Z",
                            conditions=[k.xid_condition("2026-12-01T10:20:00Z")])
    ill = k.karpenter_node(gpu, created=t0, conditions=[k.xid_condition("2026-12-01T10:20:00Z")])
    pools = {manifests.GPU_POOL: k.node_pool(manifests.GPU_POOL, "720h")}
    nominated = "Pod should schedule on: nodeclaim/gpu-x7k2p"
    # verdict: (job, its pods, events, nodes)
    scenarios: dict[str, tuple[Any, ...]] = {
        "complete": (k.foreign_job("done-job", succeeded=1, conditions=complete), ["p0o9i Succeeded"], [], []),
        "running": (k.beacon_job("train-run", active=1), ["0-r4n5m Running"], [], []),
        "restarted": (k.beacon_job("flaky-run", active=1), ["0-f1k2y Running restarted"], [], []),
        "starting": (k.beacon_job("new-run", active=1), [], [], []),
        "image-pull": (k.foreign_job("etl-train", active=1), ["m3n4b ImagePullBackOff"], [], []),
        "container-config": (k.beacon_job("cfg-run", active=1), ["0-c9f8g CreateContainerConfigError"], [], []),
        "volume-mount": (k.beacon_job("mount-run", active=1), ["0-q8w2e ContainerCreating"],
                         [k.event("Pod", "mount-run-0-q8w2e", "FailedMount", mount, "2026-12-01T10:01:00Z",
                                  source="kubelet")], []),
        "oom-killed": (k.beacon_job("oom-run", failed=1), ["0-x7k2p OOMKilled"], [], [k.spot_node(gpu)]),
        "spot-interrupted": (k.beacon_job("spot-run", active=1), ["0-bbbbb Unschedulable"],
                             [placed("spot-run-0-aaaaa"), *spot], []),
        "spot-interrupted, resumed": (k.beacon_job("spot-run", active=1), ["0-ccccc Running elsewhere"],
                                      [placed("spot-run-0-aaaaa"), *spot], []),
        "disrupted": (k.beacon_job("consolidated", failed=1), [], [
            placed("consolidated-0-d3s4r"),
            k.event("Node", gpu, "DisruptionTerminating", "Disrupting Node: Underutilized/Delete",
                    "2026-12-01T10:40:00Z", source="karpenter")], []),
        "node-repaired": (k.foreign_job("xid-run", failed=1), [], [
            placed("xid-run-0-z0x9c"), k.grace_expiring(gpu, "2026-12-01T10:50:00Z", "2026-12-01T10:50:00Z"),
            k.force_deleted("xid-run-0-z0x9c", "2026-12-01 10:50:00 +0000 UTC", "2026-12-01T10:50:01Z")], [sick]),
        "expired": (k.foreign_job("long-job", failed=1), [], [
            placed("long-job-0-d1r2n"), k.grace_expiring(gpu, "2026-12-02T10:00:00Z", "2026-12-01T10:00:00Z")],
            [old]),
        "expired, draining": (k.foreign_job("long-job", active=1), ["d1r2n Running"],
                              [k.grace_expiring(gpu, "2026-12-02T10:00:00Z", "2026-12-01T10:00:00Z")], [old]),
        "forcefully-terminated": (k.foreign_job("gone-node", failed=1), [], [
            placed("gone-node-0-k8l9m"),
            k.event("Pod", "gone-node-0-k8l9m", "Evicted", k.FORCEFUL, "2026-12-01T10:30:00Z", source="karpenter")],
            []),
        "node-unhealthy": (k.foreign_job("xid-job", failed=1), ["x1d2e Error"], [
            k.event("Node", gpu, "NodeRepairBlocked", "more than 20% nodes are unhealthy in the nodepool",
                    "2026-12-01T10:31:00Z", source="karpenter")], [ill]),
        "evicted": (k.foreign_job("pressed", failed=1), [evicted], [], []),
        "unschedulable": (k.foreign_job("llm-finetune", active=1), ["q9w8e Unschedulable"], [
            k.event("Pod", "llm-finetune-q9w8e", "FailedScheduling", insufficient, "2026-12-01T10:00:05Z",
                    source="default-scheduler")], []),
        "waiting-for-node": (k.foreign_job("llm-finetune", active=1), ["q9w8e Unschedulable"], [
            k.event("Pod", "llm-finetune-q9w8e", "Nominated", nominated, "2026-12-01T10:00:06Z", source="karpenter",
                    kind_type="Normal")], []),
        "exit-code": (k.foreign_job("plain-job", failed=1, conditions=failed[:0]), ["k1l2j Error"], [], []),
        "job-failed": (k.foreign_job("slow-job", failed=1, conditions=failed), [], [], []),
    }
    # fmt: on
    pod_states = {
        "Succeeded": ("Succeeded", ended(0, "Completed", "2026-12-01T11:00:00Z")),
        "Running": ("Running", running),
        "ImagePullBackOff": ("Pending", waiting("ImagePullBackOff", f'Back-off pulling image "{k.IMAGE}"')),
        "CreateContainerConfigError": ("Pending", waiting("CreateContainerConfigError", 'secret "wandb" not found')),
        "ContainerCreating": ("Pending", waiting("ContainerCreating")),
        "OOMKilled": ("Failed", ended(137, "OOMKilled", "2026-12-01T10:04:12Z")),
        "Error": ("Failed", ended(1, "Error", "2026-12-01T10:31:30Z")),
    }

    def pods_of(job: dict[str, Any], shorthand: list[Any]) -> list[dict[str, Any]]:
        made = []
        for pod in shorthand:
            if isinstance(pod, dict):
                made.append(pod)
                continue
            suffix, state, *how = pod.split()
            if state == "Unschedulable":
                made.append(k.unschedulable(job, suffix, insufficient))
                continue
            phase, status = pod_states[state]
            made.append(k.pod(job, suffix, phase=phase, state=status, restarts=2 if "restarted" in how else 0,
                              node="ip-10-0-3-9.ec2.internal" if "elsewhere" in how else gpu,
                              memory="16Gi" if state == "OOMKilled" else None))  # fmt: skip
        return made

    examples = []
    read_at = datetime(2026, 12, 1, 12, tzinfo=UTC)
    for name, (job, pods, events, nodes) in scenarios.items():
        state = job_state(job, pods_of(job, pods), events, {n["metadata"]["name"]: n for n in nodes}, pools)
        verdict = orchestrator_verdict(OrchestratorState("eks", "beacon-demo", ns, job["metadata"]["name"], read_at,
                                                         job=state))  # fmt: skip
        assert verdict.verdict == name, (name, verdict)
        examples.append(f"[{verdict.status}] {verdict.verdict}: {verdict.evidence}")
    gone = orchestrator_verdict(OrchestratorState("eks", "beacon-demo", ns, "old-run", read_at))
    refused = orchestrator_verdict(OrchestratorState(
        "eks", "beacon-demo", ns, "any-run", read_at,
        problem="the Kubernetes API at https://10.0.1.12 refused the doctor's identity (403 Forbidden)",
        fix="give your role an access entry: cluster.operator_role_arns in the team file, then make deploy",
    ))  # fmt: skip
    return [*examples, *(f"[{v.status}] {v.verdict}: {v.evidence}" for v in (gone, refused))]


def sagemaker_examples() -> list[str]:
    from beacon_ops.doctor.sagemaker_state import training_job_verdict

    at = datetime(2026, 12, 1, 10, 30, tzinfo=UTC)
    transitions = [{"Status": "Starting", "StartTime": datetime(2026, 12, 1, 10, tzinfo=UTC)},
                   {"Status": "Training", "StartTime": datetime(2026, 12, 1, 10, 4, tzinfo=UTC)}]  # fmt: skip
    job = {"TrainingJobName": "demo-run-r7", "SecondaryStatusTransitions": transitions}
    jobs: dict[str, dict[str, Any]] = {
        "training-job-failed": {"TrainingJobStatus": "Failed", "SecondaryStatus": "Failed", "TrainingEndTime": at,
                                "FailureReason": "AlgorithmError: ExecuteUserScriptError: exit code 1"},
        "max-runtime-exceeded": {"TrainingJobStatus": "Stopped", "SecondaryStatus": "MaxRuntimeExceeded",
                                 "StoppingCondition": {"MaxRuntimeInSeconds": 86400}},
        "complete": {"TrainingJobStatus": "Completed", "SecondaryStatus": "Completed", "TrainingEndTime": at},
        "stopped": {"TrainingJobStatus": "Stopped", "SecondaryStatus": "Stopped"},
        "running": {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Training"},
        "starting": {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Downloading",
                     "SecondaryStatusTransitions": transitions[:1]},
    }  # fmt: skip
    examples = []
    for name, described in jobs.items():
        verdict = training_job_verdict({**job, **described})
        assert verdict.verdict == name, (name, verdict)
        examples.append(f"[{verdict.status}] {verdict.verdict}: {verdict.evidence}")
    return examples


def log_examples() -> list[str]:
    """One container's log with a line of each kind the doctor knows: each at its start, then one at the gap in the
    metrics and one in the last lines; and a log with none."""
    from beacon_ops.doctor.log_lines import LogLine, log_verdicts

    start = datetime(2026, 12, 1, 10, tzinfo=UTC)
    said = [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "NVRM: Xid (PCI:0000:00:1e): 79, pid=1234, GPU has fallen off the bus.",
        "[rank1]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout",
        "botocore.exceptions.ClientError: An error occurred (AccessDenied) when calling the PutObject operation",
        "Could not resolve host: s3.us-east-1.amazonaws.com",
        "torch.distributed.DistStoreError: connect() to train-0.beacon:29500 failed: Connection refused",
        "urllib3.exceptions.ConnectTimeoutError: Connection to monitoring.us-east-1.amazonaws.com timed out",
    ]
    source = "training/train-run-0-x7k2p/train"

    def line(seconds: float, text: str) -> LogLine:
        return LogLine(start + timedelta(seconds=seconds), text, "stream-0", source)

    lines = [line(0, "starting train.py"), *(line(i + 1, text) for i, text in enumerate(said))]
    lines += [line(60 * i, f"step {i}") for i in range(1, 10)]
    gap = start + timedelta(seconds=600)  # the run's last heartbeat
    lines.append(line(601, "[rank0]: RuntimeError: NCCL communicator was aborted on rank 0"))
    lines += [line(610 + i, f"waiting for rank 0, {i} s") for i in range(50)]
    lines.append(line(2400, "Traceback: TimeoutError: The read operation timed out"))
    verdicts = log_verdicts(sorted(lines, key=lambda ln: ln.at), where="the log", gap=gap)
    nothing = log_verdicts([line(1, "epoch 0 done")], where="the cluster's application log group")
    return [f"[{v.status}] {v.verdict}: {v.evidence}" for v in (*verdicts, *nothing)]


def test_every_verdict_of_the_orchestrator_sagemaker_and_the_logs_is_on_the_reference_page_as_the_doctor_says_it() -> (
    None
):
    """Issue 28: the doctor's reference shows every verdict with an example, produced here, not written by hand."""
    produced = ["\n".join(orchestrator_examples()), "\n".join(sagemaker_examples()), "\n".join(log_examples())]
    shown = text_blocks(REFERENCE_PAGE)[-3:]
    for example, said in zip(shown, produced, strict=True):
        assert example_shown(example, said), f"the page shows\n{example}\nthe doctor says\n{said}"


def test_every_failing_or_warning_verdict_the_doctor_can_give_has_an_example() -> None:
    """Issue 28: a verdict added to the doctor without an example on its pages fails here. Read from the doctor's own
    source: Beacon's checks (on the doctor's page, as `[status] check: verdict`), the orchestrator's and SageMaker's
    verdicts and each kind of log line (on the reference page), and how a rank stopped (on the ranks page)."""
    from beacon_ops.doctor import diagnosis, log_lines, orchestrator, rank_verdict, sagemaker_state

    doctor_page, reference = (ROOT / "docs" / "doctor.md").read_text(), REFERENCE_PAGE.read_text()

    def source_of(module: Any) -> str:
        return Path(str(module.__file__)).read_text()

    source = source_of(diagnosis)
    checks = re.findall(r'Verdict\(\s*"([\w-]+)",\s*(?:FAIL|WARN),\s*"([^"]+)"', source)
    assert len(checks) >= 20, checks
    missing = [
        f"{check}: {verdict}" for check, verdict in checks if not re.search(rf"\] {check}: {verdict}[:;]", doctor_page)
    ]
    platform = source_of(orchestrator) + source_of(sagemaker_state)
    names = re.findall(r'Verdict\(\s*CHECK,\s*(?:FAIL|WARN|INFO|OK),\s*"([\w -]+)"', platform)
    names += re.findall(r'name, fix = \(\s*"([\w-]+)"', platform)
    assert len(names) >= 25, names
    missing += [name for name in names if f"] {name}:" not in reference and f"] {name}, " not in reference]
    missing += [f"{kind.name}-at-start" for kind in log_lines.CLASSES if f"] {kind.name}-at-start:" not in reference]
    hows = set(re.findall(r'how(?:=| = .*, )"(\w+)"', source_of(rank_verdict)))
    ranks_page = RANKS_PAGE.read_text()
    assert hows == {"silent", "died", "hung", "failed"}, hows
    said = {how: "went silent" if how == "silent" else how for how in hows}
    missing += [f"rank-{how}" for how in hows if not re.search(rf"`rank \d [^`]*?{said[how]}\s+at\s+step", ranks_page)]
    assert missing == [], "verdicts without an example"


# --- the rank verdicts on docs/runtime/ranks.md: each as the doctor says it on such evidence ----------------------
RANKS_PAGE = ROOT / "docs" / "runtime" / "ranks.md"
C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def rank_document(
    rank: int, step: int, pod: str, node: str, instance: str = "", written: float = 100.0, ended: str = ""
) -> bytes:
    document = RankProgress(
        rank, rank % 2, 4, step, "training", 95.0, written, written - 95, 1, pod, node, instance, 1, ended
    )
    return json.dumps(dataclasses.asdict(document)).encode()


def stall_dump(rank: int, step: int, *frames: str, at: float = 1.0) -> bytes:
    """A rank's stall dump as faulthandler writes it: its main thread, innermost first."""
    lines = "".join(f'  File "{file}", line {line} in {function}\n' for file, line, function in map(str.split, frames))
    return (f"--- rank {rank} pid 1 at {at}, step {step}: no progress for 95 s after step {step}\n"
            f"Current thread 0x1 (most recent call first):\n{lines}").encode()  # fmt: skip


def rank_check(run: str, files: dict[str, bytes], *, live: int | None = None, **recorded: Any) -> Any:
    """The doctor's rank check (its verdict, and the rank it names) on these ranks' files, as uploaded at the
    attempt's end or in `live` snapshot; `recorded`: the first mismatch torch's analyser read from their dumps."""
    from beacon_ops.doctor.diagnosis import _stopped_rank

    def key(name: str) -> str:
        if live is None:
            return contract.rank_evidence_key("smoke", run, 0, name)
        return contract.live_rank_evidence_key("smoke", run, 0, live, name)

    evidence = RunEvidence("smoke", run, rank_files=files, rank_file_keys={name: key(name) for name in files})
    dumps = [key(f"{FLIGHT_RECORDER_PREFIX}{r}") for r in range(4)]
    return _stopped_rank(evidence, FlightRecorderReading(dumps, mismatch=Mismatch(**recorded)) if recorded else None)


def four_ranks(run: str, hung: tuple[str, ...], places: list[tuple[str, str, str]], step: int) -> dict[str, bytes]:
    """Rank 3 stopped in `hung`, ranks 0-2 wait in the next all_reduce."""
    files = {rank_document_name(r): rank_document(r, step, *places[r]) for r in range(4)}
    waiting = (f"{C10D} 2793 all_reduce", "smoke_job/job.py 74 train")
    files |= {stacks_name(r): stall_dump(r, step, *waiting) for r in range(3)} | {
        stacks_name(3): stall_dump(3, step, *hung)
    }
    return files


def example_shown(example: str, produced: str) -> bool:
    """An example on the page is what the doctor said, where it shows `...` for what it leaves out: a line of
    its own stands for any lines (none too), within a line for any text."""
    pattern = "".join(
        r"(?:[^\n]*\n)*?" if line.strip() == "..." else ".*?".join(map(re.escape, line.split("..."))) + r"\n"
        for line in example.splitlines()
    )
    return re.fullmatch(pattern, produced + "\n", re.DOTALL) is not None


def test_the_rank_verdicts_on_the_runtime_loop_page_are_what_the_doctor_says_on_such_evidence() -> None:
    """Issue 27: the examples are produced, not written by hand; each example of a verdict on the page is one."""
    smoke = [("train-0", "node-0", "")] * 2 + [("train-1", "node-1", "")] * 2
    (hung, _) = rank_check("hang-r3", four_ranks("hang-r3", ("smoke_job/job.py 69 train",), smoke, 20),
                        operation="gloo:all_reduce", sequence_id=58, group="0:default_pg", joined=[0, 1, 2],
                        missing=[3])  # fmt: skip
    (live, _) = rank_check("hang-r3", four_ranks("hang-r3", ("smoke_job/job.py 69 train",), smoke, 20), live=0)
    # Rank 0 frozen: no dump, its document written before the others dumped and wait
    frozen = {rank_document_name(r): rank_document(r, 16, *smoke[r], written=100.0 if r else 90.0) for r in range(4)}
    frozen |= {stacks_name(r): stall_dump(r, 16, f"{C10D} 2793 all_reduce", at=95.0) for r in (1, 2, 3)}
    (silent, _) = rank_check("freeze-r0", frozen)
    # Node-local directories, rank 0's node sent nothing
    alone = {rank_document_name(r): rank_document(r, 16, *smoke[r]) for r in (2, 3)}
    alone |= {stacks_name(r): stall_dump(r, 16, f"{C10D} 2793 all_reduce") for r in (2, 3)}
    (sent_nothing, _) = rank_check("lost-node-0", alone)
    # Rank 3 killed outright, torchrun stopped the others (their last word: preempted); rank 2 failed, alike
    died = {rank_document_name(r): rank_document(r, 40 - (r == 3), *smoke[r], written=120.0 if r == 3 else 200.0,
                                                 ended="" if r == 3 else "preempted") for r in range(4)}  # fmt: skip
    (dead, _) = rank_check("died-r3", died)
    failing = {rank_document_name(r): rank_document(r, 40, *smoke[r], written=200.0,
                                                    ended="failed: RuntimeError" if r == 2 else "preempted")
               for r in range(4)}  # fmt: skip
    (failed, _) = rank_check("failed-r2", failing)
    assert "container's log" in failed.fix, "a failed rank's traceback is in its log, not a stack dump"
    produced = [hung.evidence, dead.evidence, failed.evidence, live.fix, silent.evidence, sent_nothing.evidence]

    page = RANKS_PAGE.read_text()
    blocks = re.findall(r"^ *```(\w*)\n(.*?)^ *```$", page, re.M | re.S)
    (notification,) = [textwrap.dedent(text).strip() for _, text in blocks if text.lstrip().startswith("Subject:")]
    prose = " ".join(re.sub(r"^ *```\w*\n.*?^ *```$", "", page, flags=re.M | re.S).split())
    # Each inline example of a verdict (not a pattern of one: `rank 0 ... hung at step N in <phase>`)
    verdict = re.compile(r"(rank(\(s\))? [\d, ]+ |its stack: )")
    examples = [code for code in re.findall(r"`([^`]+)`", prose) if verdict.match(code) and "<" not in code]
    assert len(examples) == len(produced), examples
    for example, said in zip(examples, produced, strict=True):
        assert example_shown(example, said), f"the page shows\n  {example}\nthe doctor says\n  {said}"
    assert_the_notification_is_what_the_function_publishes(notification)


def assert_the_notification_is_what_the_function_publishes(shown: str) -> None:
    from beacon_ops.doctor.notify import AlarmedRun, message_of, subject_of

    place = [("train-0-d4f1c", "ip-10-0-1-5.ec2.internal", "g6.12xlarge")] * 2
    place += [("train-1-7xk2p", "ip-10-0-2-7.ec2.internal", "g6.12xlarge")] * 2
    hanging = ("/app/model.py 41 forward", "/app/train.py 88 train_step", "/app/train.py 120 main")
    check, stopped = rank_check("hang-r3", four_ranks("hang-r3", hanging, place, 50))
    diagnosis = Diagnosis("demo", "smoke", "hang-r3", "rank-hung", verdicts=[check], lead="rank", stopped_rank=stopped)
    alarm = contract.run_alarm_name("demo", "smoke", "hang-r3", contract.RunAlarm.METRICS_LOST)
    stalled = contract.run_alarm_name("demo", "smoke", "hang-r3", contract.RunAlarm.STALLED)
    alarmed = AlarmedRun(alarm, "demo", "smoke", "hang-r3", f"{stalled} in ALARM")
    published = f"Subject: {subject_of(alarmed, diagnosis)}\n\n{message_of(alarmed, diagnosis, '<bucket>')}"
    assert example_shown(shown, published), f"the page shows\n{shown}\nthe function publishes\n{published}"


# --- Every Python block of the README and the runtime's pages runs (issue 28, item 5) -------------------------
README = ROOT / "README.md"
PAGES_WITH_CODE = [README, *sorted((ROOT / "docs" / "runtime").glob("*.md")), ROOT / "docs" / "integrations.md"]
PYTHON_FENCE = re.compile(r"^(?P<indent>[ \t]*)```py(thon)?\b[^\n]*\n(?P<code>.*?)^(?P=indent)```", re.M | re.S)
FRAGMENT = re.compile(r"<!-- docs-test: fragment of ([\w/., ]+?) -->\s*$")
# The blocks that do not run on their own, each marked on the page with the examples that run it in full
# (tests/test_examples.py runs them): listed here, so no block escapes without a line in this file.
FRAGMENTS = {"docs/integrations.md:10": "examples/lightning_module.py, examples/hf_trainer.py"}
# What the pages' loops leave to the reader (their model, its step, their data), defined before each block.
READERS_OWN = """
import torch

steps, lr = 500, 0.01  # 500 steps: the blocks' `(step + 1) % 500` checkpoint is taken once
batch = torch.randn(4, 8)
model = torch.nn.Linear(8, 1)


def build_model():
    return model


def train_step(*_):
    loss = model(batch).pow(2).mean()
    loss.backward()
    return loss.item()
"""


@dataclasses.dataclass(frozen=True)
class PythonBlock:
    where: str  # page:line of its opening fence
    code: str
    fragment_of: str | None  # the examples that run it in full, from its marker


def python_blocks(page: Path) -> list[PythonBlock]:
    text = page.read_text()
    blocks = []
    for fence in PYTHON_FENCE.finditer(text):
        line = text.count("\n", 0, fence.start()) + 1
        before = text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = FRAGMENT.search(before)
        where = f"{page.relative_to(ROOT)}:{line}"
        blocks.append(PythonBlock(where, textwrap.dedent(fence["code"]), marker[1] if marker else None))
    return blocks


def every_python_block() -> list[PythonBlock]:
    return [block for page in PAGES_WITH_CODE for block in python_blocks(page)]


def test_every_python_block_runs_or_is_a_fragment_listed_here_and_marked_on_its_page() -> None:
    blocks = every_python_block()
    assert {b.where: b.fragment_of for b in blocks if b.fragment_of} == FRAGMENTS
    runnable = [b.where for b in blocks if not b.fragment_of]
    assert runnable[0].startswith("README.md:"), "the README's loop is among the blocks that run"
    for block in blocks:
        compile(block.code, block.where, "exec")  # a fragment is still Python
        if block.fragment_of:  # and what it shows of Beacon is what its examples use
            examples = "".join((ROOT / name.strip()).read_text() for name in block.fragment_of.split(","))
            for name in set(re.findall(r"\bBeacon\w+|\brun\.\w+", block.code)):
                assert name.split(".")[-1] in examples, f"{block.where}: {name} is in none of {block.fragment_of}"


def test_the_readme_loop_and_the_runtime_pages_blocks_run_through_beacon_local_on_one_embedded_aws(
    tmp_path: Path,
) -> None:
    """Each block, as the page shows it, is the reader's `train.py`: `beacon local -- python train.py` runs it as the
    demo team's writer; the first leaves the embedded AWS up (--keep) for the others, the last stops it."""
    from tests.test_local import CHECKOUT, MARKER, demo_processes

    runnable = [block for block in every_python_block() if not block.fragment_of]
    workdir = tmp_path / "beacon"
    env = {**os.environ, MARKER: str(workdir), "PYTHONPATH": CHECKOUT, "COLUMNS": "200"}

    def beacon_local(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "beacon_ops.cli", "local", "--workdir", str(workdir), *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip

    try:
        for number, block in enumerate(runnable):
            script = tmp_path / f"block_{number}.py"
            script.write_text(f"{READERS_OWN}\n# {block.where}\n{block.code}")
            named = re.search(r'beacon\.init\("([\w-]+)"', block.code)  # a block that names its experiment
            keep = ["--keep"] if number < len(runnable) - 1 else []
            done = beacon_local("--experiment", named[1] if named else "default", "--run", f"docs-{number}", *keep,
                                "--", sys.executable, script.name)  # fmt: skip
            assert done.returncode == 0, f"{block.where}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
            report = json.loads((workdir / "report.json").read_text())
            assert report["doctor"] == "finished" and report["verification"]["records_in_s3"] == 500, block.where
    finally:
        beacon_local("--stop")
    assert demo_processes(workdir) == [], "nothing left running"


# --- The runtime's install line (issue 28, item 2) -------------------------------------------------------------
def test_the_readmes_runtime_install_line_names_declared_extras_and_installs_offline_into_a_fresh_venv(
    tmp_path: Path,
) -> None:
    """`pip install './runtime[torch]'`, as a training image or a laptop runs it: the runtime's wheel, nothing of
    the checkout, in a venv of its own (no index: this proves the package, not PyPI)."""
    readme = README.read_text()
    (install_extras, *_) = re.findall(r"pip install '\./runtime\[([\w,]+)\]'", readme)
    declared = tomllib.loads((ROOT / "runtime" / "pyproject.toml").read_text())["project"]
    extras = set(declared["optional-dependencies"])
    assert set(install_extras.split(",")) <= extras
    assert {"torch", *re.findall(r"`\[(\w+)\]`", readme)} == extras, "the README names every extra"

    source = tmp_path / "source"  # a copy: the checkout gets no build/ or egg-info
    shutil.copytree(ROOT / "runtime" / "beacon", source / "beacon", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "runtime" / "pyproject.toml", source)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(source)],
                   check=True, capture_output=True, cwd=tmp_path, timeout=120)  # fmt: skip
    (wheel,) = tmp_path.glob("beacon-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "fresh")], check=True, timeout=60)
    fresh = tmp_path / "fresh" / "bin" / "python"
    subprocess.run([*pip, "--python", str(fresh), "install", "--no-deps", "--no-index", f"{wheel}[{install_extras}]"],
                   check=True, capture_output=True, cwd=tmp_path, timeout=120)  # fmt: skip
    probe = "import beacon, importlib.metadata as m; print(beacon.__file__, m.version('beacon'), beacon.RunSettings)"
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(fresh), "-c", probe], cwd=tmp_path, env=bare, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    where, installed, _ = done.stdout.split(maxsplit=2)
    assert Path(where).is_relative_to(tmp_path / "fresh") and installed == declared["version"]


def test_the_readme_is_short_and_reaches_see_it_work_and_your_own_loop_in_its_first_120_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250

    def first(text: str) -> int:
        return next(number for number, line in enumerate(lines, 1) if text in line)

    assert first("make demo   #") < first("records_lost") < 120, "(a) the demo and what its success looks like"
    assert first("pip install './runtime") < first("run.load_checkpoint()") < 120, "(b) install, the loop"
    assert first("beacon local -- python train.py") < 120, "(b) the reader's own script, with no account"
    headings = [line for line in lines if line.startswith("## ")]
    assert any("`beacon doctor`" in heading for heading in headings), "the doctor is findable from the contents"
