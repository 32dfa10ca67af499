"""`make bench`'s library figures (issue 14), each bench function at a tiny scale: the report's shape,
and what must hold at any speed. No timing is asserted here: the goals live in `make bench` alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from beacon_ops.local.moto import ADMIN, REGION
from bench import release
from bench.mlflow_server import MlflowServer
from bench.release import bench_against_release, install_release
from bench.trackers import TRACKERS, bench_firehose, bench_mirror_lag, bench_sustained, bench_trackers
from tests.support.moto_server import MotoServer

BUCKET = "beacon-bench-test"


@pytest.fixture
def env(moto_server: MotoServer) -> dict[str, str]:
    moto_server.client("s3").create_bucket(Bucket=BUCKET)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BEACON_"))}
    return {
        **base,
        "AWS_ENDPOINT_URL": moto_server.url,
        "AWS_REGION": REGION,
        "AWS_ACCESS_KEY_ID": ADMIN["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": ADMIN["aws_secret_access_key"],
        "BEACON_ALARMS": "false",
    }


def test_the_trackers_side_by_side_and_what_a_sigkill_leaves(
    env: dict[str, str], moto_server: MotoServer, mlflow_server: MlflowServer
) -> None:
    report = bench_trackers(
        env,
        s3=moto_server.client("s3"),
        bucket=BUCKET,
        mlflow=mlflow_server,
        rounds=2,
        steps=100,
        kill_steps=20,
        step_s=0.005,
    )
    assert set(report["trackers"]) == set(TRACKERS)
    for name, row in report["trackers"].items():
        assert row["records_logged"] == 220, name
        assert len(row["ms_per_step_rounds"]) == 2 and row["ms_per_step"] > 0, name
        assert row["durable_s"] >= 0, name
        assert 0 <= row["records_lost_after_sigkill"] <= 220, name
        # What the tracker itself called durable before the kill survives it.
        assert row["durable_records_lost"] == 0, name
    beacon = report["trackers"]["beacon"]
    assert beacon["spool_fsync_s"] <= beacon["durable_s"]
    # A SIGKILL takes at most what was still queued in memory: the steps after the last durable one.
    assert beacon["records_lost_after_sigkill"] <= 20


def test_sustained_through_an_s3_outage_delivers_every_record(moto_server: MotoServer, env: dict[str, str]) -> None:
    report = bench_sustained(env, s3_endpoint=moto_server.url, bucket=BUCKET, records=2000, outage_s=2.0)
    assert report["sustained_delivered"] is True
    assert report["sustained_records"] >= 2000  # the loop logs on through the outage
    assert report["sustained_records_per_s"] >= 0 and report["sustained_with_outage_records_per_s"] > 0
    assert report["sustained_rss_start_mb"] > 0
    assert [sample["acked"] for sample in report["sustained_samples"]][-1] == report["sustained_records"]


def test_the_firehose_past_the_memory_bound_delivers_every_record(moto_server: MotoServer, env: dict[str, str]) -> None:
    """40,000 records of 10 values, never held back (more than the 250,000 values the spool writer keeps in
    memory, should the spool fall behind): every record reaches S3, and the figures `make bench` reports are there."""
    report = bench_firehose(env, s3_endpoint=moto_server.url, bucket=BUCKET, records=40_000)
    assert report["firehose_delivered"] is True and report["firehose_records"] == 40_000
    assert report["firehose_rss_growth_mb"] > 0 and report["firehose_log_records_per_s"] > 0


def test_the_mlflow_mirror_lag(env: dict[str, str], mlflow_server: MlflowServer) -> None:
    report = bench_mirror_lag(env, bucket=BUCKET, mlflow=mlflow_server, steps=50, step_s=0.01)
    assert report["mirror_behind_at_finish"] == 0
    assert 0 <= report["mirror_lag_median_s"] <= report["mirror_lag_max_s"]


def test_the_rank_signal_figure_is_measured_with_the_signals_running() -> None:
    from bench.run import bench_rank_signal

    figures = bench_rank_signal(rounds=1, steps=200)
    assert set(figures) == {"rank_signal_ms_per_step", "rank_signal_added_ms_per_step"}
    assert figures["rank_signal_ms_per_step"] > 0


def test_the_doctor_figure_counts_every_record_of_a_long_run_from_its_index(moto_server: MotoServer) -> None:
    from bench.doctor import bench_doctor

    moto_server.client("s3").create_bucket(Bucket=BUCKET)
    figures = bench_doctor(
        s3_writer=moto_server.client("s3"),
        s3_reader=moto_server.client("s3"),
        cloudwatch=moto_server.client("cloudwatch"),
        bucket=BUCKET,
        region=REGION,
        records=5_000,
        chunk_records=50,
        rounds=1,
    )
    assert (figures["doctor_long_run_chunks"], figures["doctor_long_run_index_documents"]) == (100, 1)
    assert figures["doctor_long_run_diagnosis"] == "finished"
    assert figures["doctor_long_run_s"] > 0 and figures["doctor_full_read_s"] > 0


def test_this_runtime_against_the_release_before_the_redesign(moto_server: MotoServer, env: dict[str, str]) -> None:
    """The release (tag `pre-one-log`, archived in bench/fixtures) runs on its side, installed apart; both deliver."""
    report = bench_against_release(env, s3_endpoint=moto_server.url, bucket=BUCKET, rounds=1, records=3000)
    assert report["release"]["commit"].startswith("1f1c54d")
    assert report["sustained_records_per_s_ratio"] > 0 and report["log_ms_per_step_ratio"] > 0
    assert (install_release() / "beacon" / "journal.py").exists()


def test_the_release_installs_where_git_has_no_tags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI clones main without tags: the release comes from the archive in bench/fixtures, never from git."""
    monkeypatch.setattr(release, "ROOT", tmp_path)  # not a repository
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
    runtime = install_release()
    assert runtime.is_relative_to(tmp_path / ".beacon" / "bench-release")
    assert (runtime / "beacon" / "journal.py").exists() and not (runtime / "beacon" / "log").exists()
    assert release.release_commit() == "1f1c54d6c8657f63c14051f8bcb7099a9a7547fe"
