"""`python -m beacon.sync`: a stranded spool reaches S3 exactly once, however often it is pushed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from beacon import contract
from beacon.log.spool import Spool
from beacon.sync import Outcome

from tests.conftest import WriterSession
from tests.support.job_harness import JobHarness, delivered_records
from tests.support.synth import ROOT
from tests.test_faults import small_filesystem  # noqa: F401 (a fixture)


def stranded_spool(root: Path, run: str, steps: int, *, chunk: int = 10) -> Path:
    """What a job killed with S3 out of reach leaves: sealed chunks, an open chunk with a torn tail,
    last written long enough ago that no job still owns it."""
    directory = root / "smoke" / run
    spool = Spool(directory)
    for start in range(0, steps, chunk):
        spool.append(
            [
                contract.Record("smoke", run, s, {"loss": 1.0 / (s + 1)}, 0.0)
                for s in range(start, min(start + chunk, steps))
            ]
        )
        spool.sync()
        if start + chunk < steps:
            spool.seal()
    spool.close()
    with open(directory / "open.jsonl", "ab") as handle:
        handle.write(b'{"experiment":"smoke","run":"')  # killed mid-write: never durable
    return aged(directory)


def aged(directory: Path) -> Path:
    """As if its last writer stopped ten minutes ago."""
    old = time.time() - 600
    for path in directory.rglob("*"):
        os.utime(path, (old, old))
    return directory


def sync(harness: JobHarness, directory: Path) -> subprocess.CompletedProcess[str]:
    env = {**harness.env(), "BEACON_BUCKET": harness.bucket}
    return subprocess.run(
        [sys.executable, "-m", "beacon.sync", str(directory)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def harness(as_writer: WriterSession, strict_aws: str, tmp_path: Path) -> JobHarness:
    return JobHarness(strict_aws, as_writer.bucket, tmp_path, as_writer.credentials)


def test_a_stranded_spool_is_pushed_once_and_a_second_push_sends_nothing(
    harness: JobHarness, as_writer: WriterSession, tmp_path: Path
) -> None:
    directory = stranded_spool(tmp_path / "volume", "stranded-1", 35)
    (directory / "ranks").mkdir()
    (directory / "ranks" / "stacks-rank-00003.txt").write_text("--- rank 3: no progress for 95 s\n")
    first = sync(harness, aged(directory))
    assert first.returncode == 0, first.stderr[-2000:]
    assert "4 chunk(s) uploaded (35 records)" in first.stdout
    assert "1 rank file(s)" in first.stdout, "the hung rank's stacks, kept on the volume, reach S3 too"
    again = sync(harness, aged(directory))
    assert again.returncode == 0 and "0 chunk(s) uploaded" in again.stdout
    steps = sorted(r.step for r in delivered_records(as_writer.client("s3"), as_writer.bucket, "smoke", "stranded-1"))
    assert steps == list(range(35)), "every durable step once; the torn tail was never a record"


def test_a_push_interrupted_after_s3_took_a_chunk_is_finished_without_sending_it_twice(
    harness: JobHarness, as_writer: WriterSession, tmp_path: Path
) -> None:
    """S3 acknowledged a chunk whose acknowledgement never reached the spool (the pushing pod died):
    the next push counts it as delivered, byte for byte, and sends the rest."""
    directory = stranded_spool(tmp_path / "volume", "stranded-2", 25)
    (chunk, *_rest) = Spool(directory).pending()
    as_writer.client("s3").put_object(
        Bucket=as_writer.bucket,
        Key=contract.events_key("smoke", "stranded-2", chunk.sequence),
        Body=chunk.body(),
        IfNoneMatch="*",
    )
    done = sync(harness, aged(directory))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 already in" in done.stdout
    steps = sorted(r.step for r in delivered_records(as_writer.client("s3"), as_writer.bucket, "smoke", "stranded-2"))
    assert steps == list(range(25))


def test_a_spool_that_conflicts_with_s3_is_refused_naming_the_run_and_kept(
    harness: JobHarness, as_writer: WriterSession, tmp_path: Path
) -> None:
    directory = stranded_spool(tmp_path / "volume", "stranded-3", 15)
    other = contract.Record("smoke", "stranded-3", 0, {"loss": 9.0}, 0.0, seq=0).to_line()
    key = contract.events_key("smoke", "stranded-3", 0)
    as_writer.client("s3").put_object(Bucket=as_writer.bucket, Key=key, Body=other, IfNoneMatch="*")
    done = sync(harness, directory)
    assert done.returncode == Outcome.OWNED, "another writer's chunk"
    (line,) = done.stderr.strip().splitlines()
    assert "run 'stranded-3'" in line and "differs from s3://" in line
    assert Spool(directory).pending(), "the spool keeps its records"


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda root: root / "nothing-here", "not a directory"),
        (lambda root: root, "expected <spool root>/<experiment>/<run>"),
    ],
)
def test_bad_input_is_one_line_naming_the_path(
    harness: JobHarness, tmp_path: Path, make: object, expected: str
) -> None:
    (tmp_path / "Upper Case").mkdir()
    target = make(tmp_path / "Upper Case")  # type: ignore[operator]
    done = sync(harness, target)
    assert done.returncode == Outcome.BAD_INPUT
    (line,) = done.stderr.strip().splitlines()
    assert expected in line and str(target.resolve()) in line


def test_beacon_sync_is_the_same_push_through_the_operators_command(
    harness: JobHarness, as_writer: WriterSession, tmp_path: Path
) -> None:
    directory = stranded_spool(tmp_path / "volume", "stranded-cli", 12)
    env = {**harness.env(), "BEACON_BUCKET": harness.bucket}
    done = subprocess.run(
        [sys.executable, "-m", "beacon_ops.cli", "sync", str(directory), "--no-mirrors"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "2 chunk(s) uploaded (12 records)" in done.stdout
    steps = sorted(r.step for r in delivered_records(as_writer.client("s3"), as_writer.bucket, "smoke", "stranded-cli"))
    assert steps == list(range(12))
    missing = subprocess.run(
        [sys.executable, "-m", "beacon_ops.cli", "sync", str(tmp_path / "nowhere" / "smoke" / "r")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode == Outcome.BAD_INPUT
    assert missing.stderr.strip().splitlines()[-1].endswith("not a directory")


def test_a_spool_an_older_release_wrote_just_now_is_left_alone(harness: JobHarness, tmp_path: Path) -> None:
    """A release that kept no owner record: its last write is all there is to go by."""
    directory = stranded_spool(tmp_path / "volume", "live-1", 5)
    (directory / "open.jsonl").touch()  # written just now
    done = sync(harness, directory)
    assert done.returncode == Outcome.OWNED and "a live job may still own it" in done.stderr


def test_a_spool_a_live_job_owns_is_refused_naming_the_job(harness: JobHarness, tmp_path: Path) -> None:
    directory = aged(stranded_spool(tmp_path / "volume", "live-2", 5))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from beacon.log.spool_owner import SpoolOwner;"
         "SpoolOwner.claim(Path(sys.argv[1]), run='live-2'); print('claimed', flush=True); time.sleep(120)",
         str(directory)],
        cwd=ROOT, env=harness.env(), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
        done = sync(harness, directory)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == Outcome.OWNED
    (line,) = done.stderr.strip().splitlines()
    assert f"pid {holder.pid}" in line and "run 'live-2'" in line, line
    assert Spool(directory).pending(), "nothing of the live job's was touched"


def test_a_spool_on_a_full_volume_is_one_line_saying_what_to_free_and_nothing_is_deleted(
    harness: JobHarness,
    tmp_path: Path,
    small_filesystem: Path,  # noqa: F811
) -> None:
    directory = stranded_spool(small_filesystem, "full-1", 25)
    before = sorted(p.name for p in directory.rglob("*"))
    fill(small_filesystem)
    done = sync(harness, aged(directory))
    assert done.returncode == Outcome.VOLUME_FULL, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert "its volume is full" in line and str(directory) in line and "nothing was deleted" in line
    after = sorted(p.name for p in directory.rglob("*"))
    assert set(before) <= set(after), "nothing was deleted"


def fill(volume: Path) -> None:
    """Every block, the ones ext4 keeps for root included (the tests run as root)."""
    with open(volume / "filler", "wb") as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
                filler.flush()
        except OSError:
            pass
    for n in range(10_000):  # and the inodes a new file needs
        try:
            (volume / f"inode-{n}").touch()
        except OSError:
            break


def test_each_outcome_has_its_exit_code_listed_in_both_commands_help(harness: JobHarness) -> None:
    runtime = subprocess.run(
        [sys.executable, "-m", "beacon.sync", "--help"], cwd=ROOT, env=harness.env(), capture_output=True, text=True
    )
    operator = subprocess.run(
        [sys.executable, "-m", "beacon_ops.cli", "sync", "--help"], cwd=ROOT, env=harness.env(),
        capture_output=True, text=True,
    )  # fmt: skip
    assert len({o.value for o in Outcome}) == len(Outcome)
    for outcome in Outcome:
        assert f"{outcome.value} " in runtime.stdout.split("exit codes:")[1], (outcome, runtime.stdout)
        assert f"{outcome.value} " in " ".join(operator.stdout.split()).split("Exit codes:")[1], operator.stdout
