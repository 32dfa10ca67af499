"""The fault suite: real job processes behind a fault-injecting proxy in front of moto.

Each test's name says what it injects and what it proves.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from beacon import contract

from beacon_ops.doctor.diagnosis import DoctorInputs, diagnose
from beacon_ops.evidence.reading import metric_samples
from tests.conftest import WriterSession
from tests.support import local_tls
from tests.support.fault_proxy import OVERTAKEN, FaultPlan, FaultProxy, FaultSchedule
from tests.support.job_harness import (
    JobHarness,
    assert_live_history_once,
    delivered_records,
    finish,
    signal_group,
    wait_for,
)
from tests.support.strict_s3 import BucketPolicyGate
from tests.support.synth import ROOT

PREFLIGHT_REQUESTS = 12  # the job's first requests (preflight) pass; faults start after them


def proxied(
    as_writer: WriterSession, tmp_path: Path, plan: FaultPlan, gate: BucketPolicyGate
) -> tuple[FaultProxy, JobHarness]:
    """Faults in front of an endpoint as strict as S3 (https; the bucket policy's conditions apply)."""
    proxy = FaultProxy(as_writer.aws.url, plan, gate=gate, tls=True).start()
    return proxy, JobHarness(proxy.url, as_writer.bucket, tmp_path, as_writer.credentials)


@pytest.fixture
def proxies() -> Iterator[list[FaultProxy]]:
    started: list[FaultProxy] = []
    yield started
    for proxy in started:
        proxy.stop()


def assert_exactly_once(as_writer: WriterSession, run: str, steps: int) -> None:
    records = delivered_records(as_writer.client("s3"), as_writer.bucket, "smoke", run)
    assert_live_history_once(records, steps)  # no record lost, none duplicated


def twenty_percent(**overrides: Any) -> FaultPlan:
    return FaultPlan(fraction=0.2, spare_first=PREFLIGHT_REQUESTS, **overrides)


def test_the_fault_schedule_faults_each_services_first_request_then_one_per_stride_whatever_the_interleaving() -> None:
    """A fault test asserts what it injected: the schedule is per service, so another service's
    traffic in between changes nothing, and the first eligible request is always faulted."""
    alone = FaultSchedule(0.2, "7:monitoring")
    faulted = [i for i in range(40) if alone.faults(i)]
    assert faulted[0] == 0
    assert [i // 5 for i in faulted] == list(range(8)), "exactly one fault per stride of five"
    again = FaultSchedule(0.2, "7:monitoring")
    assert [i for i in range(40) if again.faults(i)] == faulted, "the same seed, the same schedule"


def test_an_overtaken_request_is_held_until_a_later_one_was_answered_and_then_reaches_s3_second(
    as_writer: WriterSession, strict_s3: BucketPolicyGate, proxies: list[FaultProxy]
) -> None:
    """The slow link, alone: two create-only writes of one key, the first held by the proxy. The
    second is answered first (200), so the first, forwarded after it, meets S3's 412."""
    from botocore.exceptions import ClientError

    proxy = FaultProxy(as_writer.aws.url, FaultPlan(fraction=0.5, kinds=(OVERTAKEN,)), gate=strict_s3, tls=True)
    proxies.append(proxy.start())
    schedule = FaultSchedule(0.5, f"{proxy.plan.seed}:s3")
    assert schedule.faults(0) and not schedule.faults(1), "the proxy holds the first write, not the second"
    key = contract.events_key("smoke", "overtake", 0)
    first: list[BaseException | None] = []

    def write_first() -> None:
        try:
            s3_client(proxy.url, as_writer.credentials).put_object(
                Bucket=as_writer.bucket, Key=key, Body=b"first\n", IfNoneMatch="*"
            )
            first.append(None)
        except ClientError as error:
            first.append(error)

    held = threading.Thread(target=write_first)
    held.start()
    assert wait_for(lambda: proxy.stats.injected["s3:overtaken"] == 1, timeout=30), "the first write is held"
    s3_client(proxy.url, as_writer.credentials).put_object(
        Bucket=as_writer.bucket, Key=key, Body=b"second\n", IfNoneMatch="*"
    )
    held.join(timeout=60)
    (error,) = first
    assert isinstance(error, ClientError) and error.response["Error"]["Code"] == "PreconditionFailed"
    assert as_writer.client("s3").get_object(Bucket=as_writer.bucket, Key=key)["Body"].read() == b"second\n"
    assert proxy.stats.overtaken["s3"] == 1 and not proxy.stats.held_to_the_limit


def test_a_slow_link_that_delays_and_reorders_a_quarter_of_requests_loses_and_duplicates_nothing(
    as_writer: WriterSession, tmp_path: Path, proxies: list[FaultProxy], strict_s3: BucketPolicyGate
) -> None:
    """One request in four of each service is held until a request that reached the proxy after it
    was answered: chunk uploads, checkpoint uploads and heartbeats overtake one another."""
    plan = FaultPlan(fraction=0.25, kinds=(OVERTAKEN,), spare_first=PREFLIGHT_REQUESTS, hold_limit_s=5)
    proxy, harness = proxied(as_writer, tmp_path, plan, strict_s3)
    proxies.append(proxy)
    common = ("--steps", "300", "--step-sleep", "0.01", "--chunk-records", "20", "--checkpoint-interval", "100")
    result = harness.run("--run-id", "slow-link", *common)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_exactly_once(as_writer, "slow-link", 300)
    overtaken = proxy.stats.overtaken
    assert overtaken["s3"] > 0 and overtaken["monitoring"] > 0, f"held and overtaken on both: {proxy.stats}"
    answers = proxy.stats.upstream_status
    assert answers[("monitoring", 200)] > 0
    assert not [k for k in answers if k[0] == "monitoring" and k[1] != 200], f"CloudWatch refused a request: {answers}"
    as_writer.aws.reset_auth_only()
    dims = contract.run_dimensions("demo", "smoke", "slow-link")
    beats = metric_samples(as_writer.aws.client("cloudwatch"), contract.HEARTBEAT, dims, statistic="SampleCount")
    assert beats, "heartbeats arrived, late or early"


def test_20pct_5xx_throttling_resets_and_latency_lose_and_duplicate_nothing(
    as_writer: WriterSession, tmp_path: Path, proxies: list[FaultProxy], strict_s3: BucketPolicyGate
) -> None:
    proxy, harness = proxied(as_writer, tmp_path, twenty_percent(), strict_s3)
    proxies.append(proxy)
    result = harness.run("--run-id", "fault-20", "--steps", "300", "--step-sleep", "0.01", "--chunk-records", "20")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_exactly_once(as_writer, "fault-20", 300)
    injected = proxy.stats.injected
    for kind in ("error_500", "slow_down_503", "reset", "latency"):
        assert injected[f"s3:{kind}"] > 0, f"no {kind} injected on S3: {dict(injected)}"
    assert sum(v for k, v in injected.items() if k.startswith("monitoring:")) > 0


def test_a_lost_put_answer_then_throttled_reads_is_retried_not_called_another_writer(
    as_writer: WriterSession, tmp_path: Path, proxies: list[FaultProxy], strict_s3: BucketPolicyGate
) -> None:
    """S3 takes chunk 2, the job sees a 500; the retry gets 412, and the next eight reads of the key are throttled.
    A read that fails says nothing about the bytes: training goes on, and every step lands once (it was a
    RunConflictError, "another job writes this run id", at step 52-117 of 150: issue 26, finding 3)."""
    chunk = contract.events_key("smoke", "lost-answer", 2).rsplit("/", 2)[-2:]
    plan = FaultPlan(lose_answer_of="/".join(chunk), throttled_reads_after=8)
    proxy, harness = proxied(as_writer, tmp_path, plan, strict_s3)
    proxies.append(proxy)
    result = harness.run("--run-id", "lost-answer", "--steps", "150", "--step-sleep", "0.01", "--chunk-records", "10")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (proxy.stats.answers_lost, proxy.stats.reads_throttled) == (1, 8), proxy.stats
    assert "another job writes this run id" not in result.stderr
    assert_exactly_once(as_writer, "lost-answer", 150)


def test_endpoints_unreachable_mid_run_training_continues_backlog_drains_and_signals_rise_then_clear(
    as_writer: WriterSession, tmp_path: Path, proxies: list[FaultProxy], strict_s3: BucketPolicyGate
) -> None:
    """First S3 alone goes away (delivery: failures and backlog rise, reported by the live heartbeat),
    then the whole endpoint (silence: no heartbeat arrives); both clear when it comes back."""
    proxy, harness = proxied(as_writer, tmp_path, FaultPlan(), strict_s3)
    proxies.append(proxy)
    process = harness.start("--run-id", "fault-down", "--steps", "1200", "--step-sleep", "0.02")
    spool = tmp_path / "spool" / "smoke" / "fault-down"
    assert wait_for(lambda: (spool / "state.json").exists(), timeout=60)
    s3_outage, full_outage = 8.0, 6.0
    s3_down = time.time()
    proxy.unreachable(s3_outage, services=("s3",))
    sealed_before = (spool / "state.json").read_text()
    # Waited for, within the outage, rather than asserted after a fixed sleep (a loaded machine seals later)
    sealing = wait_for(lambda: (spool / "state.json").read_text() != sealed_before, timeout=s3_outage - 1)
    assert sealing, "the spool keeps sealing: training goes on"
    time.sleep(max(0.0, s3_down + s3_outage + 4 - time.time()))
    all_down = time.time()
    proxy.unreachable(full_outage)
    result = finish(process, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert proxy.stats.refused_while_down > 0
    assert_exactly_once(as_writer, "fault-down", 1200)

    as_writer.aws.reset_auth_only()
    cloudwatch = as_writer.aws.client("cloudwatch")
    dims = contract.run_dimensions("demo", "smoke", "fault-down")
    backlog = metric_samples(cloudwatch, contract.SPOOL_BACKLOG, dims, statistic="Maximum", period=1, minutes=20)
    steady = max(s.value for s in backlog if s.at.timestamp() < s3_down)  # the open chunk, normally
    during = [s.value for s in backlog if s3_down < s.at.timestamp() < s3_down + s3_outage]
    assert max(during) > 2 * steady, "the backlog grew while S3 was unreachable"
    failures = metric_samples(cloudwatch, contract.UPLOAD_FAILURES, dims, statistic="Sum", period=1, minutes=20)
    assert sum(s.value for s in failures if s.at.timestamp() > s3_down) > 0, "the delivery signal rose"
    # The final beat follows the drain; a beat just before it can share its second, so the second's least value
    drained = metric_samples(cloudwatch, contract.SPOOL_BACKLOG, dims, statistic="Minimum", period=1, minutes=20)
    assert drained[-1].value <= max(steady, 100) < max(during), "and drained back to its steady level (one chunk)"
    beats = [s.at.timestamp() for s in metric_samples(cloudwatch, contract.HEARTBEAT, dims, statistic="SampleCount")]
    gaps = [(a, b - a) for a, b in itertools.pairwise(beats)]
    assert any(gap >= full_outage - 2 and a >= all_down - 2 for a, gap in gaps), "no heartbeat arrived: silence rose"
    assert beats[-1] > all_down + full_outage, "and cleared: heartbeats came back"
    assert result.summary["delivery"]["unacknowledged_records"] == 0


def test_checkpoints_skipped_while_s3_is_away_are_logged_once_counted_and_named_by_the_doctor(
    as_writer: WriterSession, tmp_path: Path, proxies: list[FaultProxy], strict_s3: BucketPolicyGate
) -> None:
    """S3 away for 8 s while a checkpoint uploads: the next ones are skipped (by design: never two at once, never a
    blocked loop), and a crash then would resume further back. It was silent (issue 26, finding 10); now the first
    skip is logged, every skip is counted in the heartbeat, finish() and the final state, and the doctor says it."""
    proxy, harness = proxied(as_writer, tmp_path, FaultPlan(), strict_s3)
    proxies.append(proxy)
    run = "ckpt-skipped"
    process = harness.start("--run-id", run, "--steps", "600", "--step-sleep", "0.02", "--checkpoint-interval", "20")
    assert wait_for(lambda: (tmp_path / "checkpoints" / "smoke" / run / "latest.json").exists(), timeout=120)
    proxy.unreachable(8.0, services=("s3",))
    result = finish(process, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    skipped = result.summary["checkpoints_skipped"]
    assert skipped, "a checkpoint fell due while the one before still uploaded"
    logged = [line for line in result.stderr.splitlines() if "skipped: the one before is still being written" in line]
    # Once per streak of skips: a checkpoint that starts (every 20 steps) ends one, and the next skip is logged again.
    firsts = [step for i, step in enumerate(skipped) if i == 0 or step - skipped[i - 1] != 20]
    assert [line.split("checkpoint of step ")[1].split()[0] for line in logged] == [str(s) for s in firsts], logged
    assert "a crash now resumes after step" in logged[0]
    as_writer.aws.reset_auth_only()
    final = json.loads(
        as_writer.aws.client("s3")
        .get_object(Bucket=as_writer.bucket, Key=contract.final_status_key("smoke", run))["Body"]
        .read()
    )
    assert final["checkpoints_skipped"] == skipped
    dims = contract.run_dimensions("demo", "smoke", run)
    counted = metric_samples(as_writer.aws.client("cloudwatch"), contract.CHECKPOINTS_SKIPPED, dims, statistic="Sum")
    assert sum(s.value for s in counted) == len(skipped), "each skip counted in the heartbeat"
    s3, cloudwatch = as_writer.aws.client("s3"), as_writer.aws.client("cloudwatch")
    inputs = DoctorInputs(team="demo", experiment="smoke", run=run, bucket=as_writer.bucket, region="us-east-1",
                          s3=s3, cloudwatch=cloudwatch)  # fmt: skip
    diagnosis = diagnose(inputs)
    (named,) = [v for v in diagnosis.verdicts if v.check == "checkpoints"]
    assert (named.verdict, named.status) == ("skipped", "warn"), named
    assert named.evidence.startswith(f"{len(skipped)} checkpoint(s) skipped (steps {skipped[0]}"), named.evidence
    assert "a crash then would have redone the last" in named.evidence, named.evidence


@pytest.mark.parametrize("seed", [11, 23])
def test_sigterm_at_a_random_step_under_20pct_faults_delivers_everything(
    as_writer: WriterSession, tmp_path: Path, proxies: list[FaultProxy], strict_s3: BucketPolicyGate, seed: int
) -> None:
    proxy, harness = proxied(as_writer, tmp_path, twenty_percent(seed=seed), strict_s3)
    proxies.append(proxy)
    run = f"fault-term-{seed}"
    process = harness.start("--run-id", run, "--steps", "5000", "--step-sleep", "0.01", "--shutdown-budget", "40")
    spool = tmp_path / "spool" / "smoke" / run
    assert wait_for(lambda: (spool / "state.json").exists(), timeout=60)
    time.sleep(random.Random(seed).uniform(0.5, 4.0))
    signal_group(process, signal.SIGTERM)
    result = finish(process, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_exactly_once(as_writer, run, result.summary["last_step"] + 1)


def test_sigkill_at_a_random_step_then_restart_under_20pct_faults_loses_and_duplicates_nothing(
    as_writer: WriterSession, tmp_path: Path, proxies: list[FaultProxy], strict_s3: BucketPolicyGate
) -> None:
    proxy, harness = proxied(as_writer, tmp_path, twenty_percent(seed=5), strict_s3)
    proxies.append(proxy)
    common = ("--run-id", "fault-kill", "--steps", "400", "--checkpoint-interval", "50")
    process = harness.start(*common, "--step-sleep", "0.02")
    latest = tmp_path / "checkpoints" / "smoke" / "fault-kill" / "latest.json"
    assert wait_for(latest.exists, timeout=90)
    time.sleep(random.Random(5).uniform(0.2, 2.0))
    signal_group(process, signal.SIGKILL)
    process.communicate(timeout=30)
    resumed = harness.run(*common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.summary["start_step"] > 0
    assert_exactly_once(as_writer, "fault-kill", 400)


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A real ext4 of a few MB on a loop device, nearly full: the spool's disk."""
    image, mount_point = tmp_path / "spool.img", tmp_path / "small"
    mount_point.mkdir()
    try:
        subprocess.run(["truncate", "-s", "4M", str(image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", str(image)], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(mount_point)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"cannot make a small filesystem here: {error}")
    try:
        os.chmod(mount_point, 0o777)
        free = os.statvfs(mount_point).f_bavail * os.statvfs(mount_point).f_frsize
        (mount_point / "ballast").write_bytes(b"\0" * max(0, free - 96 * 1024))
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_full_spool_disk_while_s3_is_unreachable_stops_the_job_clearly_and_loses_nothing_acknowledged(
    as_writer: WriterSession,
    tmp_path: Path,
    proxies: list[FaultProxy],
    strict_s3: BucketPolicyGate,
    small_filesystem: Path,
) -> None:
    proxy, harness = proxied(as_writer, tmp_path, FaultPlan(), strict_s3)
    proxies.append(proxy)
    process = harness.start(
        "--run-id",
        "fault-full",
        "--steps",
        "100000",
        "--step-sleep",
        "0.002",
        "--spool-dir",
        str(small_filesystem),
        "--chunk-records",
        "20",
        "--shutdown-budget",
        "8",
    )
    assert wait_for(lambda: (small_filesystem / "smoke" / "fault-full" / "state.json").exists(), timeout=60)
    time.sleep(1.0)
    proxy.unreachable(600)  # S3 is gone; the spool must hold everything
    result = finish(process, timeout=240)
    assert result.returncode == 74, result.stderr[-6000:]
    assert "No space left on device" in result.stderr, result.stderr[-3000:]
    assert "records already acknowledged are safe" in result.stderr, result.stderr[-3000:]
    records = delivered_records(as_writer.client("s3"), as_writer.bucket, "smoke", "fault-full")
    steps = sorted(r.step for r in records)
    assert steps == list(range(len(steps))), "what S3 acknowledged is intact: contiguous, no duplicate"
    pending = list((small_filesystem / "smoke" / "fault-full" / "sealed").glob("chunk-*.jsonl"))
    assert pending, "what S3 did not acknowledge is still in the spool"


def s3_client(endpoint: str, credentials: dict[str, str]) -> Any:
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", verify=str(local_tls.authority().ca_file), **credentials
    )


def test_the_strict_endpoint_refuses_what_the_bucket_policy_denies_and_moto_lets_through(
    as_writer: WriterSession, strict_aws: str, strict_s3: BucketPolicyGate
) -> None:
    """moto ignores the bucket policy's conditions; the strict endpoint the job tests use does not."""
    from botocore.exceptions import ClientError

    s3 = s3_client(strict_aws, as_writer.credentials)
    history = contract.events_key("smoke", "strict", 0)
    with pytest.raises(ClientError, match="AccessDenied"):
        s3.put_object(Bucket=as_writer.bucket, Key=history, Body=b"{}\n")  # no If-None-Match: an overwrite
    s3.put_object(Bucket=as_writer.bucket, Key=history, Body=b"{}\n", IfNoneMatch="*")
    s3.put_object(Bucket=as_writer.bucket, Key=contract.final_status_key("smoke", "strict"), Body=b"{}")
    assert strict_s3.refused == 1


def test_a_plain_http_write_is_refused_by_the_policys_secure_transport_deny_and_the_jobs_https_path_is_not(
    as_writer: WriterSession, strict_aws: str, strict_s3: BucketPolicyGate, proxies: list[FaultProxy]
) -> None:
    """aws:SecureTransport is how the request arrived, not a constant: the same create-only write,
    signed by the same writer, passes over https (the job's endpoint) and is refused over plain http."""
    from botocore.exceptions import ClientError

    assert strict_aws.startswith("https://"), "the endpoint the job tests use speaks TLS, as AWS does"
    plain = FaultProxy(as_writer.aws.url, FaultPlan(), gate=strict_s3).start()
    proxies.append(plain)
    assert plain.url.startswith("http://")
    key = contract.events_key("smoke", "transport", 0)
    with pytest.raises(ClientError) as refused:
        s3_client(plain.url, as_writer.credentials).put_object(
            Bucket=as_writer.bucket, Key=key, Body=b"{}\n", IfNoneMatch="*"
        )
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
    assert strict_s3.refused == 1 and plain.stats.forwarded["s3"] == 0, "refused before moto saw it"
    s3_client(strict_aws, as_writer.credentials).put_object(
        Bucket=as_writer.bucket, Key=key, Body=b"{}\n", IfNoneMatch="*"
    )
    assert as_writer.client("s3").get_object(Bucket=as_writer.bucket, Key=key)["Body"].read() == b"{}\n"
    assert strict_s3.refused == 1


@pytest.mark.parametrize("call", ["write", "fsync"])
def test_one_eio_on_the_spool_mid_run_is_retried_the_job_exits_0_and_every_step_lands_once(
    as_writer: WriterSession, strict_aws: str, tmp_path: Path, call: str
) -> None:
    """The real job, its 5th write or fsync of the spool's open chunk failing with EIO (a write
    tears first). It was SpoolFullError, exit 74; a volume that fails once is not full."""
    harness = JobHarness(strict_aws, as_writer.bucket, tmp_path, as_writer.credentials)
    run = f"eio-{call}"
    job = [sys.executable, "-m", "tests.support.disk_fault_job", call, "5"]
    args = harness.args("--run-id", run, "--steps", "200", "--step-sleep", "0.01", "--chunk-records", "20")
    result = subprocess.run([*job, *args], cwd=ROOT, env=harness.env(), capture_output=True, text=True, timeout=240)
    assert f"EIO injected into os.{call}" in result.stderr, "the fault happened"
    assert result.returncode == 0, result.stderr[-3000:]
    retried = [line for line in result.stderr.splitlines() if "Input/output error (EIO)" in line]
    assert retried and "retrying" in retried[0] and str(tmp_path / "spool") in retried[0], result.stderr[-3000:]
    assert "the spool is full" not in result.stderr and "SpoolFullError" not in result.stderr
    assert_exactly_once(as_writer, run, 200)
