"""Evidence the run's writer can write, read by every reader: the doctor and the alarm function.

A run's writer may write anything under its prefix (a bug, another version of Beacon, a compromised container),
and chunks and preflights are create-only: one bad file is there for good. Each reader validates what it reads,
sets a bad file aside, names it, and still answers; evidence that contradicts the run (a rank outside its world,
a record of another run) is named, not believed. Each case here is written as the run's writer (IAM enforced)
on a finished one-rank run, and read as the doctor and as the alarm function read it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest
from beacon import contract
from beacon.contract.preflight import PreflightRecord
from beacon.contract.rank_evidence import RankProgress, rank_document_name
from beacon.evidence.progress import ProgressClock
from beacon.evidence.ranks import RankSignal, upload_rank_evidence

from beacon_ops.doctor import notify
from beacon_ops.doctor.diagnosis import WARN, Diagnosis, DoctorInputs, diagnose
from beacon_ops.evidence.reading import read_run
from tests.conftest import WriterSession
from tests.support.moto_server import REGION
from tests.test_alarm_notification import delivered, notify_as_the_function, topic_with_queue_as_admin

TEAM, EXPERIMENT, RUN = "demo", "smoke", "finished-alone"
STEPS = 30


def seed_finished_run(as_writer: WriterSession) -> RankProgress:
    """A one-rank run that finished: its records, its preflight, its rank's last document uploaded at the
    attempt's end and its final state, each written by the runtime's own code, as the run's writer. Returns
    the rank's document."""
    s3, bucket = as_writer.client("s3"), as_writer.bucket
    now = time.time()
    records = [
        contract.Record(EXPERIMENT, RUN, step, {"loss": 2.0 / (step + 1)}, now - 60 + step, seq=step)
        for step in range(STEPS)
    ]
    s3.put_object(
        Bucket=bucket, Key=contract.events_key(EXPERIMENT, RUN, 0), Body=b"".join(r.to_line() for r in records)
    )
    preflight = PreflightRecord(
        run=RUN, experiment=EXPERIMENT, host="train-0", pid=100, world_size=1, spool_dir="/artifacts/spool",
        spool_filesystem="nfs4", spool_persistent=True, started_at="2026-12-01T10:00:00+00:00", team=TEAM,
        region=REGION, s3_endpoint="https://s3.us-east-1.amazonaws.com", namespace=contract.metric_namespace(TEAM),
        heartbeat_interval=15.0,
    )  # fmt: skip
    s3.put_object(
        Bucket=bucket, Key=contract.preflight_key(EXPERIMENT, RUN, "1-abc.json"), Body=json.dumps(asdict(preflight))
    )
    progress = ProgressClock()
    progress.dispatched_step = STEPS - 1
    progress.step_finished()
    ranks_dir = as_writer.workdir / "ranks"
    signal = RankSignal(
        ranks_dir, rank=0, local_rank=0, world_size=1, progress=progress, interval=600, stall_dump_after=600
    ).start()
    signal.write(ended="finished")
    signal.stop()
    upload_rank_evidence(s3, bucket=bucket, experiment=EXPERIMENT, run=RUN, attempt=0, directory=ranks_dir)
    final = {"state": "finished", "attempt": 0, "last_step": STEPS - 1, "ended_at": now, "unacknowledged_records": 0}
    s3.put_object(Bucket=bucket, Key=contract.final_status_key(EXPERIMENT, RUN), Body=json.dumps(final))
    return RankProgress.from_document((ranks_dir / rank_document_name(0)).read_bytes())


def document(rank_0: RankProgress, **changed: object) -> bytes:
    return json.dumps({**asdict(rank_0), **changed}).encode()


def ranks_key(name: str) -> str:
    return f"{contract.run_prefix(EXPERIMENT, RUN)}{contract.RANKS}/attempt-00000/{name}"


def chunk_line(**fields: object) -> bytes:
    line = json.loads(contract.Record(EXPERIMENT, RUN, STEPS, {"loss": 0.1}, time.time(), seq=STEPS).to_line())
    return json.dumps({k: v for k, v in {**line, **fields}.items() if v is not None}).encode() + b"\n"


# (where the writer wrote (the key), what, and how the reader names it)
CASES: dict[str, tuple[str, Callable[[RankProgress], bytes], str]] = {
    "a rank document that is a list": (ranks_key(rank_document_name(1)), lambda _: b"[]", "not a JSON object"),
    "a rank document with a rank alone": (
        ranks_key(rank_document_name(1)), lambda _: b'{"rank": 1}', "no field 'local_rank'",
    ),
    "a rank given as a string": (
        ranks_key(rank_document_name(1)), lambda r0: document(r0, rank="1"), "rank: '1' is not int",
    ),
    "a torn rank document": (ranks_key(rank_document_name(0)), lambda r0: document(r0)[:40], "not JSON (Unterminated"),
    "a rank document under another rank's name": (
        ranks_key(rank_document_name(2)), lambda r0: document(r0), "named rank 2, but its document says rank 0",
    ),
    "a well-formed rank that never ran": (
        ranks_key(rank_document_name(1)),
        lambda r0: document(r0, rank=1, world_size=2, ended=""),
        "rank 1 of 2: the run's preflight says 1 rank(s)",
    ),
    "a chunk line without a step": (
        contract.events_key(EXPERIMENT, RUN, 1), lambda _: chunk_line(step=None), "events/",
    ),
    "a chunk line of another run": (
        contract.events_key(EXPERIMENT, RUN, 1), lambda _: chunk_line(run="someone-else"),
        "a record of smoke/someone-else",
    ),
    "a chunk line numbered 10^18": (
        contract.events_key(EXPERIMENT, RUN, 1), lambda _: chunk_line(seq=10**18),
        f"line 2: seq {10**18} where the spool's numbering is at {STEPS + 1}",
    ),
    "a chunk line numbered in text": (
        contract.events_key(EXPERIMENT, RUN, 1), lambda _: chunk_line(seq=str(STEPS + 1)),
        f"line 2: not a record (seq: '{STEPS + 1}' is not an integer)",
    ),
    "a preflight that is a list": (
        contract.preflight_key(EXPERIMENT, RUN, "2-bad.json"), lambda _: b"[]", "not a JSON object but list",
    ),
    "a preflight whose world is a string": (
        contract.preflight_key(EXPERIMENT, RUN, "2-bad.json"),
        lambda _: json.dumps({"world_size": "1", "started_at": "2026-12-01T10:01:00+00:00"}).encode(),
        "world_size: '1' is not int",
    ),
    "a preflight of nothing": (contract.preflight_key(EXPERIMENT, RUN, "2-bad.json"), lambda _: b"{}", "no field"),
    "a preflight that never calls a rank stalled": (
        contract.preflight_key(EXPERIMENT, RUN, "2-bad.json"),
        lambda _: json.dumps({"spool_dir": "/s", "spool_filesystem": "nfs4", "started_at": "2026-12-01T10:01:00+00:00",
                              "stall_dump_after": 0}).encode(),
        "stall_dump_after: 0 is not a positive number",
    ),
    "an index entry whose counts are text": (
        contract.index_key(EXPERIMENT, RUN, 0),
        lambda _: json.dumps({"group": 0, "chunks": [{"chunk": 0, "records": "x"}]}).encode(),
        "an index that is not one (records: 'x' is not a count)",
    ),
}  # fmt: skip


def diagnosed(as_writer: WriterSession) -> Diagnosis:
    inputs = DoctorInputs(team=TEAM, experiment=EXPERIMENT, run=RUN, bucket=as_writer.bucket, region=REGION,
                          s3=as_writer.client("s3", as_writer.reader),
                          cloudwatch=as_writer.client("cloudwatch", as_writer.reader))  # fmt: skip
    return diagnose(inputs)


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_file_is_set_aside_and_named_and_the_doctor_and_the_alarm_function_still_answer(
    as_writer: WriterSession, case: str
) -> None:
    rank_0 = seed_finished_run(as_writer)
    clean = diagnosed(as_writer)
    assert clean.diagnosis == "finished" and {v.check: v.verdict for v in clean.verdicts}["evidence"] == "valid"

    key, body, why = CASES[case]
    if key.startswith(contract.run_prefix(EXPERIMENT, RUN) + contract.EVENTS):  # a good line beside the bad one
        written = chunk_line() + body(rank_0)
    else:
        written = body(rank_0)
    if key.endswith(rank_document_name(0)):  # rank 0's own name is taken: its node's leader wrote this one
        key = key.replace("/attempt-00000/", "/attempt-00000/node-00000/")
    as_writer.client("s3").put_object(Bucket=as_writer.bucket, Key=key, Body=written)

    doctor = diagnosed(as_writer)
    (evidence,) = [v for v in doctor.verdicts if v.check == "evidence"]
    where = key.removeprefix(contract.run_prefix(EXPERIMENT, RUN))
    assert evidence.status == WARN and evidence.verdict == "set aside", evidence
    assert where in evidence.evidence and why in evidence.evidence, evidence.evidence
    assert doctor.diagnosis == "finished", f"the bad file changed the verdict: {doctor.headline()}"
    assert "rank-died" not in doctor.headline() and doctor.stopped_rank is None

    topic, sqs, queue, publisher = topic_with_queue_as_admin(as_writer, EXPERIMENT, RUN)
    notification = notify_as_the_function(as_writer, topic, publisher, experiment=EXPERIMENT, run=RUN)
    assert notification is not None and notification.message.startswith(doctor.headline()), notification
    assert f"[{WARN}] evidence: set aside: 1 file(s) or line(s) set aside: {where}" in notification.message
    assert "could not read" not in notification.message
    as_writer.aws.reset_auth_only()  # the admin reads the queue
    assert [m["Message"] for m in delivered(sqs, queue)] == [notification.message]


@pytest.mark.parametrize("seq", [10**18, 2**63 + 5, -1, 31.0, "31", True])
def test_a_forged_chunk_numbered_out_of_the_spools_run_is_set_aside_and_no_record_reads_as_missing(
    as_writer: WriterSession, seq: object
) -> None:
    """A chunk of its own, after the run's last: the spool numbers it from where the chunk before it ended (29), so
    a line numbered otherwise is no record of the run's, and no gap in its numbering (10^18 records missing)."""
    seed_finished_run(as_writer)
    key = contract.events_key(EXPERIMENT, RUN, 1)
    as_writer.client("s3").put_object(Bucket=as_writer.bucket, Key=key, Body=chunk_line(seq=seq))
    doctor = diagnosed(as_writer)
    (evidence,) = [v for v in doctor.verdicts if v.check == "evidence"]
    assert evidence.verdict == "set aside" and f"{key.removeprefix(contract.run_prefix(EXPERIMENT, RUN))} line 1: " in (
        evidence.evidence
    ), evidence
    assert doctor.diagnosis == "finished", doctor.headline()
    assert not any("numbered records are not in S3" in v.evidence for v in doctor.verdicts), doctor.verdicts
    read = read_run(as_writer.client("s3", as_writer.reader), as_writer.bucket, EXPERIMENT, RUN)
    assert (read.numbered, read.missing, len(read.records)) == (STEPS, 0, STEPS)


def test_a_bad_final_state_is_named_and_the_run_reads_as_one_that_wrote_none(as_writer: WriterSession) -> None:
    """The final state is the one key the writer rewrites: a bad one is set aside like any other file, and the
    run then reads as one whose end was not written (the doctor's verdict for that, not a crash)."""
    seed_finished_run(as_writer)
    key = contract.final_status_key(EXPERIMENT, RUN)
    as_writer.client("s3").put_object(Bucket=as_writer.bucket, Key=key, Body=b'{"state": 5, "attempt": 0}')
    doctor = diagnosed(as_writer)
    (evidence,) = [v for v in doctor.verdicts if v.check == "evidence"]
    assert evidence.verdict == "set aside" and "state: 5 is not str" in evidence.evidence, evidence
    assert doctor.diagnosis != "finished"
    as_writer.client("s3").put_object(Bucket=as_writer.bucket, Key=key, Body=b'{"state": "bogus", "attempt": 0}')
    doctor = diagnosed(as_writer)
    (evidence,) = [v for v in doctor.verdicts if v.check == "evidence"]
    assert "state: 'bogus' is not a state a run ends in" in evidence.evidence, evidence
    assert doctor.diagnosis != "bogus", "an invented state is not a verdict"


def test_an_unforeseen_failure_of_the_diagnosis_still_reaches_the_team(
    as_writer: WriterSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever else a file makes the diagnosis raise, the alarm function publishes the alarm with the error
    and the command to run, never the bare alarm alone."""
    seed_finished_run(as_writer)

    def a_bug_nobody_foresaw(*_: object, **__: object) -> Diagnosis:
        raise AttributeError("'list' object has no attribute 'get'")

    monkeypatch.setattr(notify, "diagnose", a_bug_nobody_foresaw)
    topic, _, _, publisher = topic_with_queue_as_admin(as_writer, EXPERIMENT, RUN)
    notification = notify_as_the_function(as_writer, topic, publisher, experiment=EXPERIMENT, run=RUN)
    assert notification is not None
    assert "the doctor failed on the run's evidence: AttributeError: 'list' object has no attribute 'get'" in (
        notification.message
    )
    assert f"beacon doctor --team {TEAM} --experiment {EXPERIMENT} --run {RUN}" in notification.message


def test_the_rank_document_parser_names_the_field(tmp_path: Path) -> None:
    progress = ProgressClock()
    signal = RankSignal(
        tmp_path, rank=0, local_rank=0, world_size=1, progress=progress, interval=600, stall_dump_after=600
    ).start()
    signal.write()
    signal.stop()
    good = RankProgress.from_document((tmp_path / rank_document_name(0)).read_bytes())
    assert RankProgress.from_document(document(good, future_field=1)) == good, "a newer version's field is left out"
    for body, why in [
        (b"[]", "not a JSON object but list"),
        (b'{"rank": 0, "lo', "not JSON (Unterminated string"),
        (document(good, step=None), "step: None is not int"),
        (document(good, wall_time="now"), "wall_time: 'now' is not float"),
        (document(good, node_rank=True), "node_rank: True is not int"),
        (b'{"rank": 0}', "no field 'local_rank'"),
    ]:
        with pytest.raises(ValueError, match=why.replace("(", r"\(")):
            RankProgress.from_document(body)
