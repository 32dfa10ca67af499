"""A spool written by the release before the one-log redesign (tag `pre-one-log`) is read by this one.

`tests/fixtures/release_spool/spool.tar.gz` (how it was made: `make.py` beside it) holds a volume that release left
mid-run: S3 took chunks 0-2, then went away; chunks 3-4 sealed and stayed, the open chunk holds the next records,
the journal the steps the spool had not fsync'd when the SIGKILL came, the W&B mirror's cursor stands at seq 119;
and what S3 held then. Synced, or continued by a new start, every step it logged arrives exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from beacon import contract

from tests.conftest import WriterSession
from tests.support.job_harness import JobHarness, delivered_records
from tests.support.synth import ROOT
from tests.test_sync import aged

FIXTURE = Path(__file__).parent / "fixtures" / "release_spool" / "spool.tar.gz"
EXPERIMENT, RUN = "lib", "release-run"
LOGGED = 300  # steps 0-299, one record each, by the release's process


@pytest.fixture
def harness(as_writer: WriterSession, strict_aws: str, tmp_path: Path) -> JobHarness:
    return JobHarness(strict_aws, as_writer.bucket, tmp_path, as_writer.credentials)


def left_by_the_release(tmp_path: Path, as_writer: WriterSession) -> Path:
    """The release's volume under `tmp_path`, and what S3 held when it was killed, in the test's bucket."""
    with tarfile.open(FIXTURE) as archive:
        archive.extractall(tmp_path, filter="data")
    s3 = as_writer.client("s3")
    for path in sorted((tmp_path / "s3").rglob("*")):
        if path.is_file():
            key = path.relative_to(tmp_path / "s3").as_posix()
            s3.put_object(Bucket=as_writer.bucket, Key=key, Body=path.read_bytes())
    return tmp_path / "spool" / EXPERIMENT / RUN


def environment(harness: JobHarness, tmp_path: Path) -> dict[str, str]:
    return {
        **{k: v for k, v in harness.env().items() if not k.startswith("WANDB_")},
        "BEACON_BUCKET": harness.bucket,
        "BEACON_RUN_ID": RUN,
        "BEACON_SPOOL_DIR": str(tmp_path / "spool"),
        "BEACON_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "BEACON_HEARTBEAT_FILE": str(tmp_path / "heartbeat"),
        "BEACON_ALARMS": "false",
        "BEACON_MIRRORS": "wandb",
        "BEACON_WANDB_MODE": "offline",
    }


def test_a_release_spool_left_mid_run_is_synced_each_step_once_and_its_mirror_goes_on_from_its_cursor(
    harness: JobHarness, as_writer: WriterSession, tmp_path: Path
) -> None:
    directory = left_by_the_release(tmp_path, as_writer)
    assert json.loads((directory / "mirrors" / "wandb.json").read_text())["seq"] == 119
    pushed = subprocess.run(
        [sys.executable, "-m", "beacon.sync", str(aged(directory))],
        cwd=ROOT, env=environment(harness, tmp_path), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr[-3000:]
    records = delivered_records(as_writer.client("s3"), as_writer.bucket, EXPERIMENT, RUN)
    assert [r.step for r in sorted(records, key=lambda r: r.seq)] == list(range(LOGGED)), "each step once, in order"
    assert [r.seq for r in sorted(records, key=lambda r: r.seq)] == list(range(LOGGED)), "numbered without a gap"
    assert {r.attempt for r in records} == {0}
    assert all(r.metrics == {"loss": 1.0 / (r.step + 1), "lr": 0.1} for r in records)
    cursor = json.loads((directory / "mirrors" / "wandb.json").read_text())
    assert cursor["seq"] == LOGGED - 1, "the W&B mirror, from seq 119 to the end\n" + pushed.stdout + pushed.stderr
    final = json.loads(
        as_writer.client("s3")
        .get_object(Bucket=as_writer.bucket, Key=contract.final_status_key(EXPERIMENT, RUN))["Body"]
        .read()
    )
    assert final["state"] == "failed", final  # killed: no clean exit


CONTINUING = """
import beacon

run = beacon.init("lib")
for step in range(run.resume_step, 320):
    run.log({"loss": 1.0 / (step + 1), "lr": 0.2}, step)
report = run.finish()
print("attempt", run.attempt, "delivered", report.delivered, flush=True)
"""


def test_a_new_start_on_a_release_spool_recovers_it_once_then_trains_as_the_next_attempt(
    harness: JobHarness, as_writer: WriterSession, tmp_path: Path
) -> None:
    directory = left_by_the_release(tmp_path, as_writer)
    script = tmp_path / "continuing.py"
    script.write_text(CONTINUING)
    aged(directory)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT, env=environment(harness, tmp_path), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "attempt 1 delivered True" in done.stdout, done.stdout
    records = delivered_records(as_writer.client("s3"), as_writer.bucket, EXPERIMENT, RUN)
    released = sorted((r for r in records if r.attempt == 0), key=lambda r: r.seq)
    assert [r.step for r in released] == list(range(LOGGED)), "the release's steps, each once"
    assert [r.seq for r in sorted(records, key=lambda r: r.seq)] == list(range(len(records))), "one numbering"
    history = contract.history(records)
    assert history.duplicated == [] and [r.step for r in history.live] == list(range(320))
