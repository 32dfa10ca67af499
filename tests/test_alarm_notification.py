"""The alarm carries the verdict (issue 17): a run's metrics-lost alarm goes to ALARM, an EventBridge rule
invokes the monitoring stack's function, and the function publishes the doctor's verdict to the team's topic.

moto runs Lambda invocations in Docker, which is not here: the handler runs in-process against a real moto
server, on the event EventBridge would deliver; the topic's subscriber is a real SQS queue. The rule, the
function and its rights are asserted on the synthesized templates, the rights as AWS evaluates them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from beacon import contract
from beacon.contract.goodput import PRICES_AS_OF
from beacon.contract.preflight import PreflightRecord
from beacon.contract.rank_evidence import RankProgress, flight_recorder_name, rank_document_name, stacks_name
from beacon.evidence.progress import ProgressClock
from beacon.evidence.ranks import Placement, RankSignal, upload_rank_evidence
from beacon.log.spool import Spool
from beacon.sinks.run_alarms import RunAlarms
from beacon.telemetry import Telemetry
from moto.sts.models import sts_backends
from smoke_job.config import parse_args

from beacon_constructs.alarm_verdict import (
    BUNDLE,
    ENV_PRICES,
    ENV_READER_ROLE_ARN,
    HANDLER,
    TIMEOUT_S,
    notifying_patterns,
    stage_bundle,
)
from beacon_ops.doctor import notify
from beacon_ops.doctor.diagnosis import DoctorInputs, diagnose
from beacon_ops.doctor.flight_recorder import NO_TORCH
from config import names
from tests.conftest import WriterSession
from tests.support.metric_history import sent_every_beat
from tests.support.moto_server import REGION, MotoServer
from tests.support.policy_eval import ACCOUNT, Decision, Deployment, Request, merge
from tests.support.strict_s3 import SessionGate
from tests.support.synth import ROOT, Synthesized
from tests.test_flight_recorder import hide_the_analyser

TEAM, EXPERIMENT, RUN = "demo", "smoke", "hang-r3"
STOPPED = Placement(pod="train-1-7xk2p", node="ip-10-0-2-7.ec2.internal", instance="g6.12xlarge")
TORCH_WAIT = (
    '  File "/opt/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce'
)


# --- the evidence a hung 4-rank run leaves, written by the runtime's own writers -------------------
# Rank 3's process: a script whose main thread hangs in `forward`, dumped by the runtime's own writer
# (a process of its own, as on a node: a test runner's threads are not a training script's).
HUNG_RANK = """
import os
import sys
from pathlib import Path
from beacon.evidence.progress import ProgressClock
from beacon.evidence.ranks import Placement, RankSignal

def forward(signal):
    signal.dump_stacks("no progress for 95 s after step 50")

progress = ProgressClock()
progress.dispatched_step = 50
progress.step_finished()
signal = RankSignal(
    Path(sys.argv[1]), rank=3, local_rank=1, world_size=4, progress=progress, interval=600,
    stall_dump_after=600, placement=Placement(*sys.argv[2:5]),
).start()
forward(signal)
os._exit(0)  # no last word: rank 3 is hung, not ended
"""


def hang_rank_3(ranks_dir: Path) -> None:
    """Rank 3's stall dump, taken inside `forward` by faulthandler, in a process of its own."""
    command = [sys.executable, "-c", HUNG_RANK, str(ranks_dir), STOPPED.pod, STOPPED.node, STOPPED.instance]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=120)


def waiting_dump(rank: int) -> str:
    """What faulthandler writes for a rank blocked in the next collective (a real dump needs a real group)."""
    return (
        f"--- rank {rank} pid {100 + rank} at {time.time():.3f}, step 50: no progress for 95 s after step 50\n"
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/usr/lib/python3.12/threading.py", line 355 in wait\n'
        '  File "/usr/lib/python3.12/threading.py", line 1032 in _bootstrap\n\n'
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        f"{TORCH_WAIT}\n"
        '  File "/app/train.py", line 88 in train_step\n'
        '  File "/app/train.py", line 120 in main\n'
    )


def stalled_for(seconds: float) -> ProgressClock:
    """A rank's clock whose last step was `seconds` ago."""
    now = [0.0]
    progress = ProgressClock(now=lambda: now[0])
    progress.dispatched_step = 50
    progress.step_finished()
    now[0] = seconds
    return progress


def upload_at_the_attempts_end(s3: Any, bucket: str, ranks_dir: Path) -> None:
    assert upload_rank_evidence(s3, bucket=bucket, experiment=EXPERIMENT, run=RUN, attempt=0, directory=ranks_dir)


def seed_hung_run(
    s3: Any, bucket: str, workdir: Path, upload: Callable[[Any, str, Path], None] = upload_at_the_attempts_end
) -> None:
    """Rank 3 of 4 (2 nodes) stopped at step 50 in forward 100 s ago (its dump taken at 95 s); ranks 0-2
    wait in all_reduce; rank 0 wrote steps 0-50 and its preflight, and `upload` took the ranks' evidence
    to S3 while they hung (by default as rank 0 does at the attempt's end)."""
    ranks_dir = workdir / "ranks"
    signals = []
    try:
        for rank in range(4):
            placement = STOPPED if rank == 3 else Placement(f"train-{rank // 2}-abc{rank}", f"ip-10-0-1-{rank}", "")
            signal = RankSignal(
                ranks_dir,
                rank=rank,
                local_rank=rank % 2,
                world_size=4,
                progress=stalled_for(100.0),
                interval=600,  # the test writes; the thread never gets to
                stall_dump_after=600,
                placement=placement,
            ).start()
            signals.append(signal)
            signal.write()
        hang_rank_3(ranks_dir)
        for rank in range(3):
            (ranks_dir / stacks_name(rank)).write_text(waiting_dump(rank))
        upload(s3, bucket, ranks_dir)  # before their last words: they still hang
    finally:
        for signal in signals:
            signal.stop()
    seed_rank_0s_records_and_preflight(s3, bucket)


def seed_rank_0s_records_and_preflight(s3: Any, bucket: str) -> None:
    """Steps 0-50 of the run as rank 0 wrote them, and its preflight (four ranks)."""
    now = time.time()
    records = [
        contract.Record(EXPERIMENT, RUN, step, {"loss": 2.0 / (step + 1)}, now - 60 + step, seq=step)
        for step in range(51)
    ]
    s3.put_object(
        Bucket=bucket, Key=contract.events_key(EXPERIMENT, RUN, 0), Body=b"".join(r.to_line() for r in records)
    )
    preflight = PreflightRecord(
        run=RUN,
        experiment=EXPERIMENT,
        host="train-0-abc0",
        pid=100,
        world_size=4,
        spool_dir="/artifacts/spool",
        spool_filesystem="nfs4",
        spool_persistent=True,
        started_at="2026-12-01T10:00:00+00:00",
        team=TEAM,
        region=REGION,
        s3_endpoint="https://s3.us-east-1.amazonaws.com",
        namespace=contract.metric_namespace(TEAM),
        heartbeat_interval=15.0,
    )
    s3.put_object(
        Bucket=bucket,
        Key=contract.preflight_key(EXPERIMENT, RUN, "1-abc.json"),
        Body=json.dumps(asdict(preflight)).encode(),
    )


def alarm_event(alarm: dict[str, Any], state: str = "ALARM", previous: str = "OK") -> dict[str, Any]:
    """What EventBridge delivers for a composite alarm's state change (no metrics: a composite has none)."""
    return {
        "version": "0",
        "id": "7f6f9f8e-0000-0000-0000-000000000000",
        "detail-type": notify.ALARM_STATE_CHANGE,
        "source": notify.ALARM_SOURCE,
        "account": ACCOUNT,
        "time": "2026-12-01T10:04:00Z",
        "region": REGION,
        "resources": [f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:{alarm['AlarmName']}"],
        "detail": {
            "alarmName": alarm["AlarmName"],
            "state": {"value": state, "reason": f"{alarm['AlarmName'].removesuffix('metrics-lost')}stalled in ALARM"},
            "previousState": {"value": previous},
            "configuration": {
                "alarmRule": alarm.get("AlarmRule", ""),
                "description": alarm.get("AlarmDescription", ""),
            },
        },
    }


def slow_alarm_event(
    experiment: str = EXPERIMENT, run: str = RUN, kind: contract.RunAlarm = contract.RunAlarm.SLOW
) -> dict[str, Any]:
    """What EventBridge delivers for the run's slow (or slowed) alarm (a metric alarm: its metric's dimensions name
    the run)."""
    event = alarm_event({"AlarmName": contract.run_alarm_name(TEAM, experiment, run, kind)})
    event["detail"]["state"]["reason"] = "Threshold Crossed: 2 datapoints were greater than or equal to 0.25"
    dimensions = contract.run_dimensions(TEAM, experiment, run)
    event["detail"]["configuration"]["metrics"] = [{"metricStat": {"metric": {"dimensions": dimensions}}}]
    return event


def topic_with_queue(aws: MotoServer) -> tuple[str, Any, str]:
    """The team's topic with a real SQS subscriber: (topic ARN, sqs client, queue URL)."""
    sns, sqs = aws.client("sns"), aws.client("sqs")
    topic = sns.create_topic(Name="beacon-demo-alarms")["TopicArn"]
    queue = sqs.create_queue(QueueName="oncall")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
    return topic, sqs, queue


def delivered(sqs: Any, queue: str) -> list[dict[str, Any]]:
    messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
    return [json.loads(m["Body"]) for m in messages]


def reading_as_aws_would_decide(demo: Synthesized, monkeypatch: pytest.MonkeyPatch, role_arn: str) -> list[SessionGate]:
    """The handler's reader sessions, each S3 read decided as AWS would for the session it took: the synthesized
    reader role's policies and the session policy the handler sent to STS (moto keeps it, and ignores it)."""
    gates: list[SessionGate] = []
    run_reader = notify.run_reader

    def gated_reader(session: Any, *, role_arn: str, bucket: str, region: str) -> Callable[[str, str], Any]:
        s3_for_run = run_reader(session, role_arn=role_arn, bucket=bucket, region=region)

        def gated(experiment: str, run: str) -> Any:
            client = s3_for_run(experiment, run)
            taken = sts_backends[role_arn.split(":")[4]]["aws"].assumed_roles[-1]
            assert (taken.role_arn, taken.session_name) == (role_arn, notify.reader_session_name(run))
            gates.append(SessionGate.of(demo.templates, TEAM, bucket, "ArtifactStoreVerdictReaderRole", taken.policy))
            return gates[-1].install(client)

        return gated

    monkeypatch.setattr(notify, "run_reader", gated_reader)
    return gates


def test_the_notification_names_the_rank_its_step_phase_place_and_hanging_frame_and_who_waits(
    demo: Synthesized, as_writer: WriterSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the Lambda entry point, with its environment, against the embedded AWS; the evidence read in a
    session of the reader role that may read this run alone, every read decided as AWS would."""
    seed_hung_run(as_writer.client("s3"), as_writer.bucket, as_writer.workdir)
    aws = as_writer.aws
    aws.reset_auth_only()  # the admin sets up the alarms and the topic; the function's rights are tested below
    cloudwatch = aws.client("cloudwatch")
    alarms = RunAlarms(cloudwatch, aws.client("ssm"), TEAM, EXPERIMENT, RUN)
    alarms.arm()  # the run's own alarms, from the monitoring stack's template, as the job creates them
    composite_name = contract.run_alarm_name(TEAM, EXPERIMENT, RUN, contract.RunAlarm.METRICS_LOST)
    cloudwatch.set_alarm_state(AlarmName=composite_name, StateValue="ALARM", StateReason="stalled")
    (composite,) = (
        cloudwatch.describe_alarms(AlarmNames=[composite_name], AlarmTypes=["CompositeAlarm"])["CompositeAlarms"]
        or cloudwatch.describe_alarms(AlarmNames=[composite_name])["MetricAlarms"]
    )
    topic, sqs, queue = topic_with_queue(aws)
    for name, value in {
        "AWS_ENDPOINT_URL": aws.url,
        "AWS_ACCESS_KEY_ID": "admin",
        "AWS_SECRET_ACCESS_KEY": "admin",
        "AWS_REGION": REGION,
        notify.ENV_TEAM: TEAM,
        notify.ENV_BUCKET: as_writer.bucket,
        notify.ENV_TOPIC_ARN: topic,
        notify.ENV_READER_ROLE_ARN: reader_role_of(Deployment(demo.templates), TEAM),
    }.items():
        monkeypatch.setenv(name, value)
    gates = reading_as_aws_would_decide(demo, monkeypatch, reader_role_of(Deployment(demo.templates), TEAM))

    result = notify.handler(alarm_event(composite), None)

    (gate,) = gates
    assert gate.refused == [], "every read the diagnosis makes is allowed to a session of the alarmed run"
    evidence = contract.rank_evidence_key(EXPERIMENT, RUN, 0, stacks_name(3))
    assert any(line.startswith(f"s3:GetObject {gate.policy_bucket_arn}/{evidence} ") for line in gate.allowed)
    assert result["published"]
    (message,) = delivered(sqs, queue)
    assert message["Subject"] == f"Beacon {TEAM}: {EXPERIMENT}/{RUN} rank-hung"
    text = message["Message"]
    verdict = text.splitlines()[0]
    assert verdict.startswith(
        f"rank-hung: rank 3 on pod {STOPPED.pod}, node {STOPPED.node}, instance type {STOPPED.instance} "
        "hung at step 51 in training ("
    ), verdict
    assert "in forward)" in verdict, "the hanging frame of the team's code"
    assert verdict.endswith("; 3 rank(s) wait in all_reduce (0, 1, 2)"), verdict
    stack = text.split("Rank 3's main thread, innermost first:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert "in dump_stacks" in stack[0] and "in forward" in stack[1], stack  # faulthandler's own dump
    assert f"Then run: beacon doctor --team {TEAM} --experiment {EXPERIMENT} --run {RUN}" in text
    assert f"Alarm {composite_name} is in ALARM" in text
    # Issue 30: what the hang has cost so far, its instances as the ranks' documents place them
    (cost,) = [line for line in text.splitlines() if line.startswith("  [info] cost: ")]
    assert re.fullmatch(
        r"  \[info\] cost: so far: hung for \d+ s on 3 instances of an unrecorded type: [0-9.]+ instance-hours \(no "
        r"instance type recorded\); on 1 instance of g6\.12xlarge: [0-9.]+ instance-hours, \$[0-9.]+ at on-demand "
        rf"\(capacity type not recorded\) \(list prices of {PRICES_AS_OF}\)",
        cost,
    ), cost


def test_without_torch_the_verdict_says_where_the_flight_recorder_dumps_are_and_who_reads_them(
    as_writer: WriterSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The function's bundle has no torch, so it cannot run PyTorch's analyser on the ranks' flight
    recorders: the rank verdict names their keys instead (`test_flight_recorder` reads real ones)."""

    def with_flight_recorders(s3: Any, bucket: str, ranks_dir: Path) -> None:
        for rank in range(4):
            (ranks_dir / flight_recorder_name(rank)).write_bytes(b"not read without torch")
        upload_at_the_attempts_end(s3, bucket, ranks_dir)

    seed_hung_run(as_writer.client("s3"), as_writer.bucket, as_writer.workdir, with_flight_recorders)
    hide_the_analyser(monkeypatch)
    as_writer.aws.reset_auth_only()
    diagnosis = diagnose(
        DoctorInputs(
            team=TEAM,
            experiment=EXPERIMENT,
            run=RUN,
            bucket=as_writer.bucket,
            region=REGION,
            s3=as_writer.aws.client("s3"),
            cloudwatch=as_writer.aws.client("cloudwatch"),
        )
    )
    assert diagnosis.diagnosis == "rank-hung"
    assert diagnosis.flight_recorder is not None
    keys = [contract.rank_evidence_key(EXPERIMENT, RUN, 0, flight_recorder_name(rank)) for rank in range(4)]
    assert diagnosis.flight_recorder.keys == keys
    (named,) = [v for v in diagnosis.verdicts if v.check == "rank"]
    assert named.evidence.endswith("; 3 rank(s) wait in all_reduce (0, 1, 2)"), "nothing read, nothing claimed"
    where = contract.rank_evidence_key(EXPERIMENT, RUN, 0, "flight-recorder-rank-<rank>")
    assert named.fix.endswith(f"; flight-recorder dumps of rank(s) 0, 1, 2, 3 at {where}: {NO_TORCH}"), named.fix


def test_the_function_reads_the_run_with_the_readers_rights_alone(as_writer: WriterSession) -> None:
    """IAM enforced: the evidence and alarms are read with no more than the reader role's rights, and the
    verdict published by an identity that may publish and do nothing else."""
    seed_hung_run(as_writer.client("s3"), as_writer.bucket, as_writer.workdir)
    topic, sqs, queue, publisher = topic_with_queue_as_admin(as_writer)
    notification = notify_as_the_function(as_writer, topic, publisher)
    assert notification is not None and notification.message.startswith("rank-hung: rank 3 on pod"), notification
    as_writer.aws.reset_auth_only()
    assert len(delivered(sqs, queue)) == 1


def test_while_the_run_still_hangs_rank_0s_live_snapshot_lets_the_notification_name_the_rank(
    as_writer: WriterSession, tmp_path: Path
) -> None:
    """No attempt has ended: the ranks' evidence is on the volume, which the function does not mount. Rank 0's
    heartbeat (the runtime's, as the writer, IAM enforced) uploads a live snapshot once a rank stalls past
    `stall_dump_after` (90 s, as deployed); the function, with the reader's rights, names rank 3 from it."""

    def rank_0s_heartbeat(s3: Any, bucket: str, ranks_dir: Path) -> None:
        flags = {"--bucket": bucket, "--team": TEAM, "--experiment": EXPERIMENT, "--run-id": RUN}
        config = parse_args([part for pair in flags.items() for part in pair]).settings
        rank_0 = Telemetry(config, s3=s3, cloudwatch=as_writer.client("cloudwatch"), progress=ProgressClock(),
                           spool=Spool(tmp_path / "spool"), run_alarms=None, ranks_dir=ranks_dir)  # fmt: skip
        rank_0.heartbeat.beat()
        assert rank_0.evidence is not None and rank_0.evidence.wait(timeout=30)

    seed_hung_run(as_writer.client("s3"), as_writer.bucket, as_writer.workdir, rank_0s_heartbeat)
    topic, sqs, queue, publisher = topic_with_queue_as_admin(as_writer)
    notification = notify_as_the_function(as_writer, topic, publisher)
    assert notification is not None
    assert notification.message.startswith(
        f"rank-hung: rank 3 on pod {STOPPED.pod}, node {STOPPED.node}, instance type {STOPPED.instance} "
        "hung at step 51 in training ("
    ), notification.message
    verdict = notification.message.splitlines()[0]
    assert "in forward)" in verdict and verdict.endswith("; 3 rank(s) wait in all_reduce (0, 1, 2)"), verdict
    assert "last word" not in verdict, "taken while the ranks hang, before any last word"
    live = "ranks/attempt-00000/live-00000/stacks-rank-00003.txt (live snapshot: rank 0 uploaded it while the run hung)"
    assert f"fix: its stack: {live}" in notification.message
    as_writer.aws.reset_auth_only()
    (message,) = delivered(sqs, queue)
    assert message["Message"] == notification.message
    listed = as_writer.aws.client("s3").list_objects_v2(
        Bucket=as_writer.bucket, Prefix=f"{contract.run_prefix(EXPERIMENT, RUN)}{contract.RANKS}/"
    )
    ranks = [item["Key"] for item in listed["Contents"]]
    assert ranks and all("/live-00000/" in key for key in ranks), "no attempt ended: only the live snapshot"


def test_a_slow_rank_is_named_in_the_notification_at_once_from_rank_0s_snapshot(
    as_writer: WriterSession, tmp_path: Path
) -> None:
    """Issue 31: rank 0's heartbeat (the runtime's, as the writer) sends StragglerWaitShare and snapshots the four
    ranks' documents while rank 2 is slow; the run's slow alarm fires (it notifies for itself), and the function, with
    the reader's rights, names rank 2 without waiting for more evidence."""
    seed_rank_0s_records_and_preflight(as_writer.client("s3"), as_writer.bucket)
    ranks_dir = tmp_path / "ranks"
    ranks_dir.mkdir()
    now = time.time()
    for rank in range(4):
        document = RankProgress(rank, rank % 2, 4, 700, "training", 0.4, now, now - 0.4, 100 + rank,
                                STOPPED.pod if rank == 2 else "train-0", STOPPED.node if rank == 2 else "node-0",
                                STOPPED.instance, 0, pace_steps=200, pace_window_s=301.0, pace_step_s=1.5,
                                pace_wait_s=0.01 if rank == 2 else 0.5)  # fmt: skip
        (ranks_dir / rank_document_name(rank)).write_text(json.dumps(asdict(document)))
    flags = {"--bucket": as_writer.bucket, "--team": TEAM, "--experiment": EXPERIMENT, "--run-id": RUN}
    config = parse_args([part for pair in flags.items() for part in pair]).settings
    rank_0 = Telemetry(config, s3=as_writer.client("s3"), cloudwatch=as_writer.client("cloudwatch"),
                       progress=ProgressClock(), spool=Spool(tmp_path / "spool"), run_alarms=None,
                       ranks_dir=ranks_dir)  # fmt: skip
    rank_0.heartbeat.cross_rank_metrics = True  # rank 0 of four, as `beacon.run` builds it
    # its earlier beats said so for minutes (the verdict's span: `contract.pace.rank_slow`); this one snapshots
    sent_every_beat(as_writer.client("cloudwatch"), TEAM, EXPERIMENT, RUN, contract.STRAGGLER_WAIT_SHARE, 0.33)
    rank_0.heartbeat.beat()
    assert rank_0.evidence is not None and rank_0.evidence.wait(timeout=30)
    topic, _, _, publisher = topic_with_queue_as_admin(as_writer)
    waits: list[float] = []
    notification = notify_as_the_function(as_writer, topic, publisher, sleep=waits.append, event=slow_alarm_event())
    assert notification is not None and waits == [], "the slow rank is named: nothing more to wait for"
    assert notification.subject == f"Beacon {TEAM}: {EXPERIMENT}/{RUN} rank-slow"
    assert notification.message.startswith(
        f"rank-slow: rank 2 on pod {STOPPED.pod}, node {STOPPED.node}, instance type {STOPPED.instance} is slow: the "
        "other ranks wait for it 33% of each 1.50 s step"
    ), notification.message


def test_a_slowed_run_is_said_in_the_notification_at_once_from_its_heartbeats_ratios(
    as_writer: WriterSession, tmp_path: Path
) -> None:
    """Issue 31: ten minutes of StepTimeRatio at 1.7 (every rank slower than the run's baseline alike, as rank 0's
    heartbeat sends it) and rank 0's beat; the run's slowed alarm fires, and the function says `run-slowed` without
    waiting for a rank to be named: there is none."""
    seed_rank_0s_records_and_preflight(as_writer.client("s3"), as_writer.bucket)
    flags = {"--bucket": as_writer.bucket, "--team": TEAM, "--experiment": EXPERIMENT, "--run-id": RUN}
    config = parse_args([part for pair in flags.items() for part in pair]).settings
    rank_0 = Telemetry(config, s3=as_writer.client("s3"), cloudwatch=as_writer.client("cloudwatch"),
                       progress=ProgressClock(), spool=Spool(tmp_path / "spool"), run_alarms=None)  # fmt: skip
    rank_0.heartbeat.beat()
    sent_every_beat(as_writer.client("cloudwatch"), TEAM, EXPERIMENT, RUN, contract.STEP_TIME_RATIO, 1.7)
    topic, _, _, publisher = topic_with_queue_as_admin(as_writer)
    waits: list[float] = []
    event = slow_alarm_event(kind=contract.RunAlarm.SLOWED)
    notification = notify_as_the_function(as_writer, topic, publisher, sleep=waits.append, event=event)
    assert notification is not None and waits == [], "no rank to name: nothing to wait for"
    assert notification.subject == f"Beacon {TEAM}: {EXPERIMENT}/{RUN} run-slowed"
    assert notification.message.startswith("run-slowed: every step takes 1.70x the run's baseline"), (
        notification.message
    )


def notify_as_the_function(
    as_writer: WriterSession,
    topic: str,
    publisher: dict[str, str],
    sleep: Callable[[float], None] = time.sleep,
    experiment: str = EXPERIMENT,
    run: str = RUN,
    event: dict[str, Any] | None = None,
) -> notify.Notification | None:
    """The run's metrics-lost alarm event (or `event`), handled with the reader's rights and published as
    `publisher`."""
    lost = contract.run_alarm_name(TEAM, experiment, run, contract.RunAlarm.METRICS_LOST)
    event = event or alarm_event({"AlarmName": lost})
    return notify.notify(
        event,
        sleep=sleep,
        team=TEAM,
        bucket=as_writer.bucket,
        topic_arn=topic,
        region=REGION,
        s3_for_run=lambda *_: as_writer.client("s3", as_writer.reader),
        cloudwatch=as_writer.client("cloudwatch", as_writer.reader),
        sns=as_writer.aws.client("sns", **publisher),
    )


def rank_0_froze(cloudwatch: Any) -> Callable[[Any, str, Path], None]:
    """Rank 0 froze with the others: before it did, its heartbeat sent the cross-rank view (a run of several
    ranks); it uploads nothing after, so the ranks' evidence is on the volume alone when the alarm fires."""

    def upload(_s3: Any, _bucket: str, _ranks_dir: Path) -> None:
        dimensions = contract.run_dimensions(TEAM, EXPERIMENT, RUN)
        cloudwatch.put_metric_data(
            Namespace=contract.metric_namespace(TEAM),
            MetricData=[
                {
                    "MetricName": contract.RANK_STEP_SPREAD.name,
                    "Dimensions": [{"Name": k, "Value": v} for k, v in dimensions.items()],
                    "Value": 0.0,
                    "StorageResolution": 1,
                }
            ],
        )

    return upload


def test_when_rank_0_froze_the_function_reads_again_until_a_node_leaders_snapshot_names_the_rank(
    as_writer: WriterSession,
) -> None:
    """A frozen rank 0 uploads nothing, and its silent alarm can fire before a node leader stands in for it
    (`stall_dump_after`, 90 s as deployed). The function then reads the run again every 15 s, for 150 s at most,
    while a run of several ranks has no rank named: here node 1's leader uploads its live snapshot during the
    second wait, and the verdict names rank 3 from it."""
    s3 = as_writer.client("s3")
    seed_hung_run(s3, as_writer.bucket, as_writer.workdir, rank_0_froze(as_writer.client("cloudwatch")))
    topic, _, _, publisher = topic_with_queue_as_admin(as_writer)
    waits: list[float] = []

    def node_leader_stands_in(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 2:
            upload_rank_evidence(s3, bucket=as_writer.bucket, experiment=EXPERIMENT, run=RUN, attempt=0,
                                 directory=as_writer.workdir / "ranks", live=0, node=1)  # fmt: skip

    notification = notify_as_the_function(as_writer, topic, publisher, sleep=node_leader_stands_in)
    assert waits == [notify.RANK_EVIDENCE_POLL_S] * 2, "read again until the snapshot was there, and no longer"
    assert notification is not None and notification.message.startswith(
        f"rank-hung: rank 3 on pod {STOPPED.pod}, node {STOPPED.node}"
    ), notification
    assert "ranks/attempt-00000/node-00001/live-00000/stacks-rank-00003.txt" in notification.message
    assert "No rank named" not in notification.message


def test_when_no_rank_evidence_comes_the_function_says_where_it_is_after_its_bounded_wait(
    as_writer: WriterSession,
) -> None:
    froze = rank_0_froze(as_writer.client("cloudwatch"))
    seed_hung_run(as_writer.client("s3"), as_writer.bucket, as_writer.workdir, froze)
    topic, _, _, publisher = topic_with_queue_as_admin(as_writer)
    waits: list[float] = []
    notification = notify_as_the_function(as_writer, topic, publisher, sleep=waits.append)
    assert sum(waits) == notify.RANK_EVIDENCE_WAIT_S and notify.RANK_EVIDENCE_WAIT_S + 60 <= TIMEOUT_S
    assert notification is not None and notification.message.endswith(
        "No rank named: its ranks' evidence did not reach S3 within 150 s of the alarm; it is on the run's volume "
        "(`python -m beacon.sync` uploads it)."
    ), notification


def test_the_wait_for_rank_evidence_stays_within_what_lambda_says_the_function_has_left() -> None:
    class Context:
        def __init__(self, remaining_ms: int) -> None:
            self.remaining_ms = remaining_ms

        def get_remaining_time_in_millis(self) -> int:
            return self.remaining_ms

    assert notify.rank_wait_for(Context(TIMEOUT_S * 1000)) == notify.RANK_EVIDENCE_WAIT_S
    assert notify.rank_wait_for(Context(100_000)) == 100 - notify.AFTER_THE_WAIT_S
    assert notify.rank_wait_for(Context(30_000)) == 0.0, "no time to wait: the verdict as it stands"
    assert notify.rank_wait_for(None) == notify.RANK_EVIDENCE_WAIT_S


def topic_with_queue_as_admin(
    as_writer: WriterSession, experiment: str = EXPERIMENT, run: str = RUN
) -> tuple[str, Any, str, dict[str, str]]:
    """The topic and queue, the run's own alarms (as the job creates them), and an identity that may only
    publish, set up by the admin."""
    publisher = as_writer.aws.user_without_rights("verdict-publisher")
    as_writer.aws.reset_auth_only()
    try:
        RunAlarms(as_writer.aws.client("cloudwatch"), as_writer.aws.client("ssm"), TEAM, experiment, run).arm()
        topic, sqs, queue = topic_with_queue(as_writer.aws)
        statement = {"Effect": "Allow", "Action": "sns:Publish", "Resource": "*"}  # moto matches no topic ARN
        as_writer.aws.client("iam").put_user_policy(
            UserName="verdict-publisher",
            PolicyName="publish",
            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [statement]}),
        )
        return topic, sqs, queue, publisher
    finally:
        as_writer.aws.enforce_iam()


# --- what is ignored, and what has no evidence ----------------------------------------------------
@pytest.fixture
def team_aws(moto_server: MotoServer) -> tuple[MotoServer, str, str, Any, str]:
    moto_server.client("s3").create_bucket(Bucket="beacon-demo-test")
    topic, sqs, queue = topic_with_queue(moto_server)
    return moto_server, "beacon-demo-test", topic, sqs, queue


def run_notify(team_aws: tuple[MotoServer, str, str, Any, str], event: dict[str, Any]) -> notify.Notification | None:
    aws, bucket, topic, _, _ = team_aws
    return notify.notify(
        event,
        team=TEAM,
        bucket=bucket,
        topic_arn=topic,
        region=REGION,
        s3_for_run=lambda *_: aws.client("s3"),
        cloudwatch=aws.client("cloudwatch"),
        sns=aws.client("sns"),
    )


@pytest.mark.parametrize(
    ("alarm", "state"),
    [
        (contract.run_alarm_name(TEAM, EXPERIMENT, RUN, contract.RunAlarm.METRICS_LOST), "OK"),
        (contract.run_alarm_name(TEAM, EXPERIMENT, RUN, contract.RunAlarm.METRICS_LOST), "INSUFFICIENT_DATA"),
        (contract.run_alarm_name(TEAM, EXPERIMENT, RUN, contract.RunAlarm.STALLED), "ALARM"),  # the composite notifies
        (contract.team_alarm_name(TEAM, contract.TeamAlarm.RESTARTS), "ALARM"),
        (contract.run_alarm_name("vision", EXPERIMENT, RUN, contract.RunAlarm.METRICS_LOST), "ALARM"),
    ],
)
def test_an_ok_transition_or_another_alarm_is_ignored(
    team_aws: tuple[MotoServer, str, str, Any, str], alarm: str, state: str
) -> None:
    assert run_notify(team_aws, alarm_event({"AlarmName": alarm}, state=state)) is None
    assert delivered(team_aws[3], team_aws[4]) == []


def test_an_event_that_is_not_an_alarm_state_change_is_ignored(team_aws: tuple[MotoServer, str, str, Any, str]) -> None:
    event = alarm_event({"AlarmName": contract.run_alarm_name(TEAM, "e", "r", contract.RunAlarm.METRICS_LOST)})
    assert run_notify(team_aws, {**event, "detail-type": "CloudWatch Alarm Configuration Change"}) is None


def test_a_run_with_no_evidence_gets_a_clear_message_not_a_crash(
    team_aws: tuple[MotoServer, str, str, Any, str],
) -> None:
    """Its own alarms are gone too: the name alone says which run, since one hyphen parts experiment and run."""
    alarm = contract.run_alarm_name(TEAM, "ghost", "r9", contract.RunAlarm.METRICS_LOST)
    notification = run_notify(team_aws, alarm_event({"AlarmName": alarm}))
    assert notification is not None
    assert notification.subject == f"Beacon {TEAM}: ghost/r9 silent"
    assert notification.message.startswith("silent: no heartbeat in CloudWatch for this run"), notification.message
    assert "[fail] job: not started: no preflight record under the run prefix" in notification.message
    (message,) = delivered(team_aws[3], team_aws[4])
    assert message["Message"] == notification.message


def test_an_ambiguous_name_with_no_alarms_left_says_so(team_aws: tuple[MotoServer, str, str, Any, str]) -> None:
    alarm = contract.run_alarm_name(TEAM, "my-exp", "run-2", contract.RunAlarm.METRICS_LOST)
    notification = run_notify(team_aws, alarm_event({"AlarmName": alarm}))
    assert notification is not None and "does not say where the experiment ends" in notification.message
    assert notification.subject == f"Beacon {TEAM}: /my-exp-run-2 no verdict"


def test_the_message_fits_sns_limits() -> None:
    alarmed = notify.AlarmedRun("a", TEAM, "e" * 63, "r" * 63, "")
    assert len(notify.subject_of(alarmed, None)) <= notify.SUBJECT_LIMIT
    assert len(notify._fit("é" * notify.MESSAGE_LIMIT).encode()) <= notify.MESSAGE_LIMIT


# --- the template: rule, function, environment ----------------------------------------------------
def resources(demo: Synthesized, kind: str) -> dict[str, Any]:
    return {k: r for k, r in demo.template("monitoring").of_type(kind).items() if k.startswith("AlarmVerdict")}


def test_the_rule_sends_only_the_teams_notifying_run_alarms_going_to_alarm_to_the_function(demo: Synthesized) -> None:
    (rule,) = resources(demo, "AWS::Events::Rule").values()
    pattern = rule["Properties"]["EventPattern"]
    named = [{"wildcard": f"beacon-demo-run-*-{suffix}"} for suffix in ("metrics-lost", "slow", "slowed")]
    assert pattern == {
        "source": ["aws.cloudwatch"],
        "detail-type": ["CloudWatch Alarm State Change"],
        "detail": {"alarmName": named, "state": {"value": ["ALARM"]}},
    }
    assert notifying_patterns(TEAM) == notify.alarm_patterns(TEAM)
    ((function_id, function),) = resources(demo, "AWS::Lambda::Function").items()
    (target,) = rule["Properties"]["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [function_id, "Arn"]}
    (permission,) = resources(demo, "AWS::Lambda::Permission").values()
    rule_id = next(iter(resources(demo, "AWS::Events::Rule")))
    assert permission["Properties"]["Principal"] == "events.amazonaws.com"
    assert permission["Properties"]["SourceArn"] == {"Fn::GetAtt": [rule_id, "Arn"]}
    properties = function["Properties"]
    assert properties["Handler"] == HANDLER == "beacon_ops.doctor.notify.handler"
    assert properties["Runtime"].startswith("python3.")
    assert properties["Timeout"] == TIMEOUT_S >= notify.RANK_EVIDENCE_WAIT_S + 60, "its bounded wait, and time after"
    variables = properties["Environment"]["Variables"]
    assert set(variables) == {
        notify.ENV_TEAM, notify.ENV_BUCKET, notify.ENV_TOPIC_ARN, notify.ENV_READER_ROLE_ARN, notify.ENV_PRICES
    }  # fmt: skip
    assert (ENV_READER_ROLE_ARN, ENV_PRICES) == (notify.ENV_READER_ROLE_ARN, notify.ENV_PRICES)
    assert notify.prices_of(variables[notify.ENV_PRICES]) == demo.config.prices.table(), "the team file's prices"
    assert variables[notify.ENV_TEAM] == TEAM
    assert variables[notify.ENV_TOPIC_ARN] == {"Ref": demo.template("monitoring").one_of_type("AWS::SNS::Topic")[0]}
    assert "Layers" not in properties and "VpcConfig" not in properties, "no Kubernetes API, nothing but AWS APIs"


# --- least privilege, as AWS would evaluate it ------------------------------------------------------
@pytest.fixture(scope="module")
def aws(demo: Synthesized, vision: Synthesized) -> Deployment:
    return Deployment(merge(demo.templates, vision.templates))


def role_of(aws: Deployment, team: str) -> str:
    """The function's own role (Lambda's execution role)."""
    name = names.stack_name(team, "artifacts")
    return aws.arn(name, aws.find(name, "AWS::IAM::Role", "ArtifactStoreVerdictRole"))


def reader_role_of(aws: Deployment, team: str) -> str:
    """The role the function takes, per alarm, in a session scoped to the alarmed run."""
    name = names.stack_name(team, "artifacts")
    return aws.arn(name, aws.find(name, "AWS::IAM::Role", "ArtifactStoreVerdictReaderRole"))


def arn_of(aws: Deployment, team: str, component: str, kind: str, prefix: str = "") -> str:
    name = names.stack_name(team, component)
    return aws.arn(name, aws.find(name, kind, prefix))


def topic_of(aws: Deployment, team: str) -> str:
    name = names.stack_name(team, "monitoring")
    return str(aws.resolve(name, {"Ref": aws.find(name, "AWS::SNS::Topic")}))


def own_logs(aws: Deployment, team: str) -> str:
    return arn_of(aws, team, "monitoring", "AWS::Logs::LogGroup", "AlarmVerdictLogs")


TLS = {"aws:SecureTransport": True}


def decision(aws: Deployment, action: str, resource: str, principal: str, **context: object) -> Decision:
    return aws.decide(Request(action, resource, principal, {**TLS, **context})).decision


def session_of(aws: Deployment, experiment: str = EXPERIMENT, run: str = RUN) -> tuple[str, dict[str, Any]]:
    """The reader role, and the session policy the function takes it with for this run's alarm."""
    bucket = arn_of(aws, TEAM, "artifacts", "AWS::S3::Bucket", "ArtifactStoreBucket")
    return reader_role_of(aws, TEAM), notify.run_session_policy(bucket.split(":::", 1)[1], experiment, run)


def test_the_function_may_read_the_runs_evidence_and_publish_to_its_topic(aws: Deployment) -> None:
    role = role_of(aws, TEAM)
    functions = aws.templates[names.stack_name(TEAM, "monitoring")].of_type("AWS::Lambda::Function")
    (function,) = [f for k, f in functions.items() if k.startswith("AlarmVerdict")]
    assert aws.resolve(names.stack_name(TEAM, "monitoring"), function["Properties"]["Role"]) == role
    reader, session_policy = session_of(aws)
    variables = function["Properties"]["Environment"]["Variables"]
    assert aws.resolve(names.stack_name(TEAM, "monitoring"), variables[notify.ENV_READER_ROLE_ARN]) == reader
    bucket = arn_of(aws, TEAM, "artifacts", "AWS::S3::Bucket", "ArtifactStoreBucket")
    bucket_key = arn_of(aws, TEAM, "artifacts", "AWS::KMS::Key", "ArtifactStoreKey")
    s3 = {"kms:ViaService": f"s3.{REGION}.amazonaws.com"}
    sns = {"kms:ViaService": f"sns.{REGION}.amazonaws.com"}
    as_the_function = [
        ("sts:AssumeRole", reader, {}),
        ("cloudwatch:GetMetricStatistics", "*", {}),
        (
            "cloudwatch:DescribeAlarms",
            f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:"
            + contract.run_alarm_name(TEAM, EXPERIMENT, RUN, contract.RunAlarm.SILENT),
            {},
        ),
        ("sns:Publish", topic_of(aws, TEAM), {}),
        ("kms:GenerateDataKey", arn_of(aws, TEAM, "monitoring", "AWS::KMS::Key", "MonitoringTopicKey"), sns),
        ("kms:Decrypt", arn_of(aws, TEAM, "monitoring", "AWS::KMS::Key", "MonitoringTopicKey"), sns),
        ("logs:PutLogEvents", own_logs(aws, TEAM).replace(":*", ":log-stream:2026/12/01/[$LATEST]abc"), {}),
    ]
    for action, resource, context in as_the_function:
        explanation = aws.decide(Request(action, resource, role, {**TLS, **context}))
        assert explanation.decision is Decision.ALLOW, f"{action} {resource} -> {explanation}"
    in_the_runs_session = [
        ("s3:GetObject", f"{bucket}/{contract.rank_evidence_key(EXPERIMENT, RUN, 0, stacks_name(3))}", {}),
        # a live snapshot, uploaded while the run hangs: under the run's prefix like the rest
        ("s3:GetObject", f"{bucket}/{contract.live_rank_evidence_key(EXPERIMENT, RUN, 0, 2, stacks_name(3))}", {}),
        # a node leader's (rank 0 stopped, or node-local ranks directories)
        (
            "s3:GetObject",
            f"{bucket}/{contract.node_rank_evidence_key(EXPERIMENT, RUN, 0, 1, stacks_name(3), snapshot=0)}",
            {},
        ),
        ("s3:GetObject", f"{bucket}/{contract.events_key(EXPERIMENT, RUN, 0)}", {}),
        ("s3:GetObject", f"{bucket}/{contract.index_key(EXPERIMENT, RUN, 0)}", {}),
        ("s3:GetObject", f"{bucket}/{contract.preflight_key(EXPERIMENT, RUN, '1-abc.json')}", {}),
        ("s3:GetObject", f"{bucket}/{contract.final_status_key(EXPERIMENT, RUN)}", {}),
        ("s3:ListBucket", bucket, {"s3:prefix": contract.run_prefix(EXPERIMENT, RUN)}),
        ("s3:ListBucket", bucket, {"s3:prefix": contract.run_prefix(EXPERIMENT, RUN) + "ranks/"}),
        ("kms:Decrypt", bucket_key, s3),
    ]
    for action, resource, context in in_the_runs_session:
        explanation = aws.decide(Request(action, resource, reader, {**TLS, **context}), session_policy)
        assert explanation.decision is Decision.ALLOW, f"{action} {resource} -> {explanation}"


def test_the_function_may_do_nothing_else(aws: Deployment) -> None:
    role = role_of(aws, TEAM)
    bucket = arn_of(aws, TEAM, "artifacts", "AWS::S3::Bucket", "ArtifactStoreBucket")
    other_bucket = arn_of(aws, "vision", "artifacts", "AWS::S3::Bucket", "ArtifactStoreBucket")
    evidence = f"{bucket}/{contract.rank_evidence_key(EXPERIMENT, RUN, 0, stacks_name(3))}"
    bucket_key = arn_of(aws, TEAM, "artifacts", "AWS::KMS::Key", "ArtifactStoreKey")
    refused = [
        ("s3:GetObject", evidence, {}),  # its own role reads nothing: only a session scoped to the run does
        ("s3:ListBucket", bucket, {"s3:prefix": contract.run_prefix(EXPERIMENT, RUN)}),
        ("kms:Decrypt", bucket_key, {"kms:ViaService": f"s3.{REGION}.amazonaws.com"}),
        ("sts:AssumeRole", role_of(aws, "vision"), {}),
        ("sts:AssumeRole", reader_role_of(aws, "vision"), {}),
        ("sns:Publish", topic_of(aws, "vision"), {}),
        ("sns:Subscribe", topic_of(aws, TEAM), {}),
        ("cloudwatch:PutMetricData", "*", {}),
        ("cloudwatch:SetAlarmState", f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:beacon-demo-run-x-y-silent", {}),
        ("cloudwatch:DeleteAlarms", f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:beacon-demo-run-x-y-silent", {}),
        ("cloudwatch:DescribeAlarms", f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:beacon-vision-run-x-y-silent", {}),
        ("ssm:GetParameter", f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/beacon/demo/run-alarm-template", {}),
        ("eks:DescribeCluster", f"arn:aws:eks:{REGION}:{ACCOUNT}:cluster/beacon-demo", {}),
        ("logs:PutLogEvents", own_logs(aws, "vision").replace(":*", ":log-stream:x"), {}),
    ]
    for action, resource, context in refused:
        explanation = aws.decide(Request(action, resource, role, {**TLS, **context}))
        assert explanation.decision is not Decision.ALLOW, f"{action} {resource} -> {explanation}"
    reader, session_policy = session_of(aws)
    another_run = f"{bucket}/{contract.rank_evidence_key(EXPERIMENT, RUN + '-2', 0, stacks_name(3))}"
    assert aws.decide(Request("s3:GetObject", another_run, reader, TLS)).decision is Decision.ALLOW, (
        "the role alone reads any run's evidence: the session policy is what narrows it to the alarmed run"
    )
    refused_in_the_session = [
        ("s3:GetObject", another_run, {}),
        ("s3:GetObject", f"{bucket}/{contract.events_key('other', RUN, 0)}", {}),
        ("s3:ListBucket", bucket, {"s3:prefix": contract.run_prefix(EXPERIMENT, RUN + "-2")}),
        ("s3:ListBucket", bucket, {"s3:prefix": f"{contract.EXPERIMENTS_PREFIX}{EXPERIMENT}/"}),
        ("s3:ListBucket", bucket, {"s3:prefix": ""}),
        ("s3:PutObject", evidence, {}),
        ("s3:DeleteObject", evidence, {}),
        ("s3:DeleteObjectVersion", evidence, {}),
        ("s3:GetObject", f"{bucket}/not-experiments/x", {}),
        # what a diagnosis never reads: the run's model, its TensorBoard files, its hyperparameters
        ("s3:GetObject", f"{bucket}/{contract.checkpoint_key(EXPERIMENT, RUN, 100)}", {}),
        ("s3:GetObject", f"{bucket}/{contract.tensorboard_key(EXPERIMENT, RUN, 'events.out.tfevents.1')}", {}),
        ("s3:GetObject", f"{bucket}/{contract.hyperparams_key(EXPERIMENT, RUN)}", {}),
        ("s3:GetObject", f"{other_bucket}/{contract.rank_evidence_key(EXPERIMENT, RUN, 0, stacks_name(3))}", {}),
        ("s3:ListBucket", other_bucket, {"s3:prefix": contract.run_prefix(EXPERIMENT, RUN)}),
        ("kms:Decrypt", bucket_key, {}),  # only through S3
        ("kms:Encrypt", bucket_key, {"kms:ViaService": f"s3.{REGION}.amazonaws.com"}),
        ("sns:Publish", topic_of(aws, TEAM), {}),
        ("cloudwatch:GetMetricStatistics", "*", {}),
    ]
    for action, resource, context in refused_in_the_session:
        explanation = aws.decide(Request(action, resource, reader, {**TLS, **context}), session_policy)
        assert explanation.decision is not Decision.ALLOW, f"{action} {resource} -> {explanation}"


def test_only_the_functions_role_may_take_the_reader_role(aws: Deployment) -> None:
    reader = reader_role_of(aws, TEAM)
    assert decision(aws, "sts:AssumeRole", reader, role_of(aws, TEAM)) is Decision.ALLOW
    doctor = arn_of(aws, TEAM, "artifacts", "AWS::IAM::Role", "ArtifactStoreReaderRole")
    writer = arn_of(aws, TEAM, "artifacts", "AWS::IAM::Role", "ArtifactStoreWriterRole")
    others = (
        doctor,
        writer,
        role_of(aws, "vision"),
        "lambda.amazonaws.com",
        "pods.eks.amazonaws.com",
        f"arn:aws:iam::{ACCOUNT}:root",
    )
    for principal in others:
        assert decision(aws, "sts:AssumeRole", reader, principal) is not Decision.ALLOW, principal


def test_the_session_policy_of_the_longest_names_fits_sts() -> None:
    """AssumeRole takes a session policy of at most 2,048 characters: the longest bucket, experiment and run."""
    longest = "x" * 63
    policy = notify.run_session_policy(longest, longest, longest, partition="aws-us-gov")
    assert len(json.dumps(policy, separators=(",", ":"))) <= 2048
    assert len(notify.reader_session_name(longest)) <= 64


def test_a_name_that_would_widen_the_session_policy_is_refused() -> None:
    for experiment, run in (("smoke", "*"), ("*", RUN), ("smoke", "r?n")):
        with pytest.raises(ValueError, match=r"run|experiment"):
            notify.run_session_policy("b", experiment, run)


def test_only_lambda_may_take_the_functions_role(aws: Deployment) -> None:
    role = role_of(aws, TEAM)
    assert decision(aws, "sts:AssumeRole", role, "lambda.amazonaws.com") is Decision.ALLOW
    for principal in ("pods.eks.amazonaws.com", "sagemaker.amazonaws.com", f"arn:aws:iam::{ACCOUNT}:root"):
        assert decision(aws, "sts:AssumeRole", role, principal) is not Decision.ALLOW


# --- the bundle: nothing missing, nothing more -----------------------------------------------------
LAMBDA_PROVIDES = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six.py")

ISOLATED_IMPORT = """
import sys
assert not any("site-packages" in p for p in sys.path), sys.path  # -S: no site, no .pth
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from beacon_ops.doctor import notify
assert notify.__file__.startswith(sys.argv[1]), notify.__file__
import beacon.contract, beacon.contract.rank_evidence, beacon.contract.preflight
class Nothing:
    def __getattr__(self, name):
        raise AssertionError("an ignored event calls nothing")
ok = {"source": "aws.cloudwatch", "detail-type": "CloudWatch Alarm State Change",
      "detail": {"alarmName": "beacon-demo-run-e-r-metrics-lost", "state": {"value": "OK"}}}
assert notify.notify(ok, team="demo", bucket="b", topic_arn="t", region="us-east-1",
                     s3_for_run=Nothing(), cloudwatch=Nothing(), sns=Nothing()) is None
for name in ("torch", "aws_cdk", "kubernetes", "moto", "config", "stacks", "workloads", "beacon_constructs"):
    assert name not in sys.modules, name
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise AssertionError(f"{name} is importable: the bundle is not isolated")
print("isolated import ok")
"""


def lambda_runtime(tmp_path: Path) -> Path:
    """What Lambda's Python runtime brings besides the standard library: boto3 and its dependencies."""
    import boto3

    site = Path(boto3.__file__).parents[1]
    provided = tmp_path / "lambda-runtime"
    provided.mkdir()
    for name in LAMBDA_PROVIDES:
        (provided / name).symlink_to(site / name)
    return provided


def test_the_bundle_imports_the_handler_with_nothing_but_itself_and_boto3(tmp_path: Path) -> None:
    bundle = stage_bundle(tmp_path / "bundle")
    done = subprocess.run(
        [sys.executable, "-S", "-I", "-c", ISOLATED_IMPORT, str(bundle), str(lambda_runtime(tmp_path))],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "isolated import ok" in done.stdout


def test_the_synthesized_asset_is_the_bundle(demo: Synthesized, tmp_path: Path) -> None:
    (function,) = resources(demo, "AWS::Lambda::Function").values()
    asset = demo.outdir / f"asset.{function['Properties']['Code']['S3Key'].removesuffix('.zip')}"
    bundle = stage_bundle(tmp_path / "bundle")
    files = sorted(str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(asset)) for p in asset.rglob("*") if p.is_file())
    assert all((bundle / f).read_bytes() == (asset / f).read_bytes() for f in files)
    assert {source.split("/")[0] for source, _ in BUNDLE} == {"runtime", "beacon_ops"}
    assert not any(f.startswith(("beacon_ops/cli", "beacon_ops/jobs", "beacon_ops/local")) for f in files)
    # Of the runtime, the contract wing alone: nothing that starts a thread, uploads or touches torch.
    assert {f for f in files if f.startswith("beacon/")} == {"beacon/__init__.py"} | {
        f"beacon/contract/{p.name}" for p in (ROOT / "runtime/beacon/contract").glob("*.py")
    }
    assert "beacon_ops/doctor/notify.py" in files and (ROOT / "beacon_ops/doctor/notify.py").exists()
