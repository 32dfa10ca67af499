"""The runtime at the worst moment, in-process and fast: a kill inside a seal, a chunk acknowledged
while the heartbeat counts the backlog, a drain whose upload outlives the budget, a NaN loss in a
metric batch, a CloudWatch that never answers. Each test stops the code exactly where production
would hurt, with a hook or a stub, never with a sleep and luck."""

from __future__ import annotations

import io
import math
import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from beacon import contract, kill_points
from beacon.contract import Phase
from beacon.evidence.progress import ProgressClock
from beacon.log.reconcile import RunConflictError, reconcile
from beacon.log.spool import OPEN, Spool, SpoolDiskError, SpoolFullError
from beacon.process.liveness import Liveness
from beacon.sinks import spool_writer as spool_writer_module
from beacon.telemetry import Telemetry
from botocore.config import Config
from botocore.exceptions import ClientError
from smoke_job.config import parse_args

from beacon_ops.evidence.reading import finest_period, metric_samples
from beacon_ops.local.moto import ADMIN, PUT_METRIC_DATA_BYTES, strict_metric_data
from tests.support.disk_fault_job import EioOnOpenChunk
from tests.support.moto_server import MotoServer


class Killed(BaseException):
    """Stands in for SIGKILL inside this process: nothing after the kill point runs."""


def records(steps: range) -> list[contract.Record]:
    return [contract.Record("e", "r", s, {"loss": 1.0}, 0.0) for s in steps]


@pytest.fixture
def kill_at() -> Any:
    def arm(name: str) -> None:
        def handler(hit: str) -> None:
            if hit == name:
                kill_points.install(lambda _hit: None)
                raise Killed(hit)

        kill_points.install(handler)

    yield arm
    kill_points.install(lambda _hit: None)


# --- defect 4: a kill inside seal() ---------------------------------------------------------------
class FakeS3:
    """list_objects_v2 and get_object over a dict of keys: what reconcile reads."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects

    def get_paginator(self, _name: str) -> Any:
        objects = self.objects

        class Pages:
            def paginate(self, Bucket: str, Prefix: str) -> list[dict[str, Any]]:
                return [{"Contents": [{"Key": k} for k in sorted(objects) if k.startswith(Prefix)]}]

        return Pages()

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        return {"Body": io.BytesIO(self.objects[Key])}


@pytest.mark.parametrize("point", [kill_points.SEAL_STATE_WRITTEN, kill_points.SEAL_RENAMED])
def test_a_kill_inside_seal_then_the_uploader_acknowledging_leaves_a_position_that_reuses_nothing(
    tmp_path: Path, kill_at: Any, point: str
) -> None:
    """The old seal renamed first and wrote the state after: killed in between, with the chunk
    already acknowledged (deleted), a restart reused the chunk number, the seq numbers and the steps."""
    spool = Spool(tmp_path)
    spool.append(records(range(3)))
    spool.seal()
    spool.append(records(range(3, 6)))
    kill_at(point)
    with pytest.raises(Killed):
        spool.seal()
    in_s3 = {}
    for chunk in Spool(tmp_path).pending():  # a restart; the uploader delivers and acknowledges all
        in_s3[contract.events_key("e", "r", chunk.sequence)] = chunk.body()
        chunk.path.unlink()
    restarted = Spool(tmp_path)
    assert restarted.next_chunk == 2, "a chunk number S3 holds is never reused"
    reconcile(FakeS3(in_s3), bucket="b", experiment="e", run="r", spool=restarted)
    assert (restarted.next_chunk, restarted.next_seq, restarted.last_step) == (2, 6, 5)
    restarted.append(records(range(6, 7)))
    sealed = restarted.seal()
    assert sealed is not None and sealed.sequence == 2
    assert contract.Record.from_line(sealed.body()).seq == 6


def test_a_restore_that_returns_the_state_file_but_not_a_chunk_it_counts_never_skips_that_chunks_steps(
    tmp_path: Path,
) -> None:
    """SageMaker restores file by file: state.json can come back while a sealed chunk it counts does
    not, and S3 never got that chunk. The steps in it exist nowhere: they must be replayed."""
    spool = Spool(tmp_path)
    spool.append(records(range(3)))
    first = spool.seal()
    spool.append(records(range(3, 6)))
    second = spool.seal()
    assert first is not None and second is not None
    in_s3 = {contract.events_key("e", "r", first.sequence): first.body()}  # only the first was uploaded
    first.path.unlink()
    second.path.unlink()  # not restored
    restored = Spool(tmp_path)
    reconcile(FakeS3(in_s3), bucket="b", experiment="e", run="r", spool=restored)
    assert restored.last_step == 2, "steps 3-5 are in no chunk and not in S3: they will be recorded again"
    assert restored.next_chunk == 2, "and chunk 1's number is still never reused"


def test_an_open_chunk_caught_between_state_and_rename_keeps_its_own_number(tmp_path: Path, kill_at: Any) -> None:
    spool = Spool(tmp_path)
    spool.append(records(range(4)))
    kill_at(kill_points.SEAL_STATE_WRITTEN)
    with pytest.raises(Killed):
        spool.seal()
    assert (tmp_path / OPEN).exists(), "killed before the rename"
    restarted = Spool(tmp_path)
    assert [c.sequence for c in restarted.pending()] == [0], "no gap, no second number for the same records"
    assert restarted.next_chunk == 1 and restarted.next_seq == 4


def test_recovering_a_torn_open_chunk_never_rewrites_its_complete_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old recovery rewrote the file with write_bytes (truncate, then write): a second kill in
    that window lost fsync'd records. Only the torn tail is cut now, in place."""
    spool = Spool(tmp_path)
    spool.append(records(range(5)))
    spool.sync()
    with open(tmp_path / OPEN, "ab") as handle:
        handle.write(b'{"run":"r","step":5,"lo')
    inode = (tmp_path / OPEN).stat().st_ino
    writes: list[str] = []
    original = Path.write_bytes

    def spy(path: Path, data: Any) -> int:
        writes.append(path.name)
        return original(path, data)

    monkeypatch.setattr(Path, "write_bytes", spy)
    recovered = Spool(tmp_path)
    monkeypatch.undo()
    assert OPEN not in writes
    (chunk,) = recovered.pending()
    assert chunk.path.stat().st_ino == inode, "the same file, renamed: never rewritten"
    assert chunk.records == 5


# --- defect 3: the heartbeat and the drain race the uploader ---------------------------------------
def test_the_backlog_is_counted_from_memory_while_the_uploader_deletes_acknowledged_chunks(tmp_path: Path) -> None:
    """The old `pending()` listed the sealed files, then read them: a chunk acknowledged in between
    raised FileNotFoundError in the heartbeat thread, which died."""
    spool = Spool(tmp_path)
    for start in range(0, 30, 3):
        spool.append(records(range(start, start + 3)))
        spool.seal()
    for chunk in spool.pending()[:5]:
        chunk.path.unlink()  # gone from disk between the listing and the reading
    assert spool.unacknowledged_records() == 30
    for chunk in spool.pending():
        spool.acknowledge(chunk)
    assert spool.unacknowledged_records() == 0


class SlowS3:
    """put_object that takes `seconds`, counting every PUT per key."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.puts: dict[str, int] = {}
        self.lock = threading.Lock()
        self.in_flight = threading.Event()

    def put_object(self, **request: Any) -> dict[str, Any]:
        with self.lock:
            self.puts[request["Key"]] = self.puts.get(request["Key"], 0) + 1
        self.in_flight.set()
        time.sleep(self.seconds)
        return {}


class RecordingCloudWatch:
    """Refuses what CloudWatch refuses; records every accepted request."""

    def __init__(self, *, block: threading.Event | None = None, fail_first: int = 0) -> None:
        self.requests: list[list[dict[str, Any]]] = []
        self.block = block
        self.fail_first = fail_first

    def put_metric_data(self, Namespace: str, MetricData: list[dict[str, Any]]) -> dict[str, Any]:
        if self.block is not None:
            self.block.wait()
        if self.fail_first:
            self.fail_first -= 1
            raise ClientError({"Error": {"Code": "InternalFailure", "Message": "injected"}}, "PutMetricData")
        try:
            strict_metric_data(MetricData)
        except Exception as error:
            refused = {"Error": {"Code": "InvalidParameterValue", "Message": str(error)}}
            raise ClientError(refused, "PutMetricData") from error
        self.requests.append(MetricData)
        return {}

    def data(self, metric: contract.Metric) -> list[dict[str, Any]]:
        return [d for request in self.requests for d in request if d["MetricName"] == metric.name]


def telemetry(tmp_path: Path, *, s3: Any, cloudwatch: Any, **flags: str) -> Telemetry:
    args = {"--bucket": "b", "--run-id": "r1", "--flush-interval": "0.05", "--heartbeat-interval": "0.1", **flags}
    config = parse_args([part for pair in args.items() for part in pair]).settings
    spool = Spool(tmp_path / "spool")
    return Telemetry(
        config,
        s3=s3,
        cloudwatch=cloudwatch,
        progress=ProgressClock(),
        spool=spool,
        run_alarms=None,
    )


def test_a_drain_whose_upload_outlives_the_budget_returns_on_time_and_puts_no_chunk_twice(tmp_path: Path) -> None:
    """The old close() joined the uploader with a timeout, then drove the spool from the main thread
    while the uploader was still inside put_object: one chunk was PUT twice, and the final cycle
    ignored the deadline (1.46 s on a 0.5 s budget)."""
    s3 = SlowS3(seconds=1.5)
    sink = telemetry(tmp_path, s3=s3, cloudwatch=RecordingCloudWatch())
    sink.start()
    for step in range(20):
        sink.log(step, {"loss": 1.0})
    assert s3.in_flight.wait(timeout=10), "the first chunk is sealed and its PUT is in flight"
    started = time.monotonic()
    report = sink.close(budget=0.5)
    assert time.monotonic() - started < 0.5 + 0.3
    assert max(s3.puts.values()) == 1, s3.puts
    assert report.unacknowledged_records > 0, "what did not reach S3 is reported, and stays in the spool"


# --- defect 5: NaN and Inf -------------------------------------------------------------------------
def test_a_diverging_loss_keeps_the_heartbeat_flowing_is_counted_and_is_stored_faithfully(tmp_path: Path) -> None:
    cloudwatch = RecordingCloudWatch()
    sink = telemetry(tmp_path, s3=SlowS3(0), cloudwatch=cloudwatch)
    for step, value in enumerate([1.0, math.nan, math.inf, -math.inf, 2.0**400, 0.5]):
        sink.log(step, {"loss": value})
    sink.spool_writer.persist(final=False)  # the spool thread reads the logged values into the window
    sink.heartbeat.beat()
    assert cloudwatch.data(contract.HEARTBEAT), "the request was valid: the heartbeat arrived"
    (loss,) = cloudwatch.data(contract.LOSS)
    assert loss["StatisticValues"]["SampleCount"] == 2 and loss["StatisticValues"]["Maximum"] == 1.0
    (diverged,) = cloudwatch.data(contract.NON_FINITE_LOSS)
    assert diverged["Value"] == 4
    sink.spool_writer.persist(final=True)
    (chunk,) = sink.spool.pending()
    stored = [record.metrics["loss"] for record in contract.records_of(chunk.body())]
    assert math.isnan(stored[1]) and stored[2] == math.inf and stored[3] == -math.inf and stored[4] == 2.0**400


def test_a_failed_metric_batch_is_counted_in_the_next_one_rather_than_thrown_away(tmp_path: Path) -> None:
    cloudwatch = RecordingCloudWatch(fail_first=1)
    sink = telemetry(tmp_path, s3=SlowS3(0), cloudwatch=cloudwatch)
    sink.window.stats.upload_failures = 3
    sink.log(0, {"loss": 1.0})
    sink.spool_writer.persist(final=False)  # the spool thread reads the logged values into the window
    sink.heartbeat.beat()
    sink.heartbeat.beat()
    (failures,) = [d for d in cloudwatch.data(contract.UPLOAD_FAILURES) if len(d["Dimensions"]) == 3]
    assert failures["Value"] == 3
    (loss,) = cloudwatch.data(contract.LOSS)
    assert loss["StatisticValues"]["SampleCount"] == 1


def test_the_embedded_aws_refuses_what_cloudwatch_refuses(moto_server: MotoServer) -> None:
    cloudwatch = moto_server.client("cloudwatch")
    good = {"MetricName": "M", "Value": 1.0}
    for bad in (
        {"MetricName": "M", "Value": math.inf},
        {"MetricName": "M", "Value": 2.0**361},
        {"MetricName": "M", "StatisticValues": {"SampleCount": 1, "Sum": math.nan, "Minimum": 0, "Maximum": 1}},
    ):
        with pytest.raises(ClientError, match="InvalidParameterValue"):
            cloudwatch.put_metric_data(Namespace="Strict", MetricData=[good, bad])
    with pytest.raises(ClientError, match="InvalidParameterValue"):
        cloudwatch.put_metric_data(Namespace="Strict", MetricData=[good] * 1001)
    cloudwatch.put_metric_data(Namespace="Strict", MetricData=[good])


def cloudwatch_as_sent(server: MotoServer) -> tuple[Any, list[int], list[list[dict[str, Any]]]]:
    """A CloudWatch client that sends its bodies uncompressed (the largest they can be), with the size
    of each PutMetricData body and the data it carried."""
    client = boto3.client(
        "cloudwatch",
        endpoint_url=server.url,
        region_name="us-east-1",
        config=Config(disable_request_compression=True, retries={"max_attempts": 1}),
        **ADMIN,
    )
    sizes: list[int] = []
    sent: list[list[dict[str, Any]]] = []
    client.meta.events.register(
        "before-send.cloudwatch.PutMetricData", lambda request, **_: sizes.append(len(request.body))
    )
    client.meta.events.register(
        "before-parameter-build.cloudwatch.PutMetricData", lambda params, **_: sent.append(params["MetricData"])
    )
    return client, sizes, sent


def test_the_embedded_aws_refuses_a_put_metric_data_over_1_mb_as_cloudwatch_does(moto_server: MotoServer) -> None:
    """413 RequestEntityTooLarge, on a request valid in every other way (30 dimensions of 1,024
    characters: about 31 KB a datum). moto took any size."""
    cloudwatch, sizes, _ = cloudwatch_as_sent(moto_server)
    widest = {"MetricName": "M", "Dimensions": [{"Name": f"D{i}", "Value": "v" * 1024} for i in range(30)], "Value": 1}
    with pytest.raises(ClientError) as refused:
        cloudwatch.put_metric_data(Namespace="Strict", MetricData=[widest] * 34)
    assert sizes[-1] > PUT_METRIC_DATA_BYTES
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 413
    assert refused.value.response["Error"]["Code"] == "RequestEntityTooLarge"
    assert refused.value.response["Error"]["Message"] == f"Request size {sizes[-1]} exceeded 1048576 bytes"
    cloudwatch.put_metric_data(Namespace="Strict", MetricData=[widest] * 30)
    assert sizes[-1] <= PUT_METRIC_DATA_BYTES, "just under the limit: accepted"


def test_the_embedded_aws_refuses_more_than_1440_datapoints_and_the_readers_ask_for_fewer(
    moto_server: MotoServer,
) -> None:
    """CloudWatch answers GetMetricStatistics with 1,440 datapoints at most and refuses a request for more;
    moto answered. The doctor's 30-minute heartbeat question at 1 s (1,805) was refused on AWS, and every run
    read as silent. `metric_samples` now takes the finest period that fits: 5 s for 30 minutes."""
    cloudwatch = moto_server.client("cloudwatch")
    now = datetime.now(UTC)
    question = {"Namespace": "Strict", "MetricName": "M", "Statistics": ["SampleCount"], "EndTime": now}
    with pytest.raises(ClientError) as refused:
        cloudwatch.get_metric_statistics(**question, StartTime=now - timedelta(seconds=1441), Period=1)
    assert refused.value.response["Error"]["Code"] == "InvalidParameterCombination"
    assert "requested up to 1441 datapoints" in refused.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as odd:
        cloudwatch.get_metric_statistics(**question, StartTime=now - timedelta(minutes=5), Period=7)
    assert odd.value.response["Error"]["Code"] == "InvalidParameterValue"
    cloudwatch.get_metric_statistics(**question, StartTime=now - timedelta(seconds=1440), Period=1)
    assert finest_period(30 * 60 + 5, high_resolution=True) == 5
    assert finest_period(24 * 60, high_resolution=True) == 1
    assert finest_period(3 * 86_400, high_resolution=False) == 180
    dims = contract.run_dimensions("demo", "smoke", "strict")
    assert metric_samples(cloudwatch, contract.HEARTBEAT, dims, statistic="SampleCount") == [], "asked, not refused"


def test_the_jobs_largest_metric_batch_is_one_request_far_under_the_size_limit(
    tmp_path: Path, moto_server: MotoServer
) -> None:
    """Every metric a batch can carry (a phase open inside two others, NaN and finite losses, upload
    latencies, checkpoints, failures), the longest team, experiment and run ids the job accepts, and
    three failed batches' windows merged into it: one request, under a tenth of the limit uncompressed.
    A batch's size is bounded by its metrics, not by how many steps or failures it sums."""
    cloudwatch, sizes, sent = cloudwatch_as_sent(moto_server)
    longest = {flag: (flag[2] * 63) for flag in ("--team", "--experiment", "--run-id")}
    sink = telemetry(tmp_path, s3=SlowS3(0), cloudwatch=cloudwatch, **longest)
    for phase in (Phase.SETUP, Phase.EVALUATION, Phase.CHECKPOINT):
        sink.progress.enter(phase)
    for window in range(4):
        for step in range(window * 5000, (window + 1) * 5000):
            sink.log(step, {"loss": math.nan if step % 7 == 0 else 1.0 / (step + 1)})
        sink.spool_writer.persist(final=False)  # the spool thread reads the logged values into the window
        sink.checkpoint_finished(2.5)
        with sink.window.lock:
            sink.window.stats.upload_latencies_ms.extend([12.5] * 1000)
            sink.window.stats.upload_failures += 3
        if window < 3:
            sink.window.restore(sink.heartbeat.metric_batch(time.time(), [])[1])  # failed: merged into the next
    sink.heartbeat.beat()
    assert sink.report.metric_batches == 1 and sink.report.metric_failures == 0, "accepted by the strict AWS"
    (request,) = sent
    carried = {datum["MetricName"] for datum in request}
    assert carried == {
        metric.name
        for metric in (
            contract.HEARTBEAT,
            contract.PROGRESS_AGE,
            contract.STALL_RATIO,
            contract.STEPS_PER_SECOND,
            contract.PHASE_SECONDS,
            contract.SPOOL_BACKLOG,
            contract.UPLOAD_FAILURES,
            contract.LOSS,
            contract.NON_FINITE_LOSS,
            contract.STEP,
            contract.UPLOAD_LATENCY,
            contract.CHECKPOINT_SECONDS,
        )
    }
    (size,) = sizes
    assert size * 10 < PUT_METRIC_DATA_BYTES, f"{size} bytes"


# --- defect 10: disk, S3, CloudWatch and liveness never wait on each other ---------------------------
def test_a_cloudwatch_that_never_answers_delays_neither_durability_nor_uploads_nor_liveness(tmp_path: Path) -> None:
    stuck = threading.Event()
    s3 = SlowS3(0)
    sink = telemetry(tmp_path, s3=s3, cloudwatch=RecordingCloudWatch(block=stuck))
    liveness = Liveness(tmp_path / "heartbeat", local_rank=0, interval=0.05).start()
    try:
        sink.start()
        for step in range(10):
            sink.log(step, {"loss": 1.0})
        assert sink.wait_durable(9, timeout=5), "durable while CloudWatch hangs"
        deadline = time.monotonic() + 5
        while not s3.puts and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s3.puts, "uploaded while CloudWatch hangs"
        touched = liveness.path.stat().st_mtime_ns
        time.sleep(0.2)
        assert liveness.path.stat().st_mtime_ns > touched, "alive while CloudWatch hangs"
    finally:
        stuck.set()
        sink.close(budget=2)
        liveness.stop()


def test_a_slow_s3_does_not_delay_durability(tmp_path: Path) -> None:
    """The old uploader fsync'd the spool and called S3 in turn: a slow PUT held back `latest`."""
    sink = telemetry(tmp_path, s3=SlowS3(seconds=3), cloudwatch=RecordingCloudWatch())
    sink.start()
    try:
        for step in range(5):
            sink.log(step, {"loss": 1.0})
        assert sink.s3.in_flight.wait(timeout=10), "a chunk is sealed; its PUT now takes 3 s"
        for step in range(5, 10):
            sink.log(step, {"loss": 1.0})
        started = time.monotonic()
        assert sink.wait_durable(9, timeout=2)
        assert time.monotonic() - started < 1
    finally:
        sink.close(budget=0.5)


# --- defect 12: a TensorBoard part left open by a crash ------------------------------------------
def test_a_tensorboard_part_a_crash_left_open_is_sealed_and_uploaded_on_restart(tmp_path: Path) -> None:
    # A flush interval no persist outlasts: the part stays open however slow this machine is.
    first = telemetry(tmp_path, s3=SlowS3(0), cloudwatch=RecordingCloudWatch(), **{"--flush-interval": "3600"})
    first.log(0, {"loss": 1.0})
    first.spool_writer.persist(final=False)  # the part is open, its points on disk; then the process dies
    (part,) = (tmp_path / "spool" / "tensorboard").glob("part-*")
    assert any(part.glob("events.out.tfevents.*"))
    s3 = SlowS3(0)
    restarted = telemetry(tmp_path, s3=s3, cloudwatch=RecordingCloudWatch())
    assert not part.exists()
    restarted.uploader.upload_pending()
    assert any(contract.TENSORBOARD in key and part.name in key for key in s3.puts), s3.puts


class OccupiedS3:
    """Every key already holds other bytes: S3's 412, then a different body on read."""

    def __init__(self) -> None:
        self.puts = 0

    def put_object(self, **_request: Any) -> dict[str, Any]:
        self.puts += 1
        raise ClientError({"Error": {"Code": "PreconditionFailed", "Message": "exists"}}, "PutObject")

    def get_object(self, **_request: Any) -> dict[str, Any]:
        return {"Body": io.BytesIO(b'{"other":"writer"}\n')}


def test_a_conflict_that_appears_mid_run_stops_the_job_instead_of_retrying_forever(tmp_path: Path) -> None:
    s3 = OccupiedS3()
    sink = telemetry(tmp_path, s3=s3, cloudwatch=RecordingCloudWatch())
    sink.start()
    try:
        sink.log(0, {"loss": 1.0})
        deadline = time.monotonic() + 10
        while sink.lifecycle.fatal is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(RunConflictError, match="another job writes this run id"):
            sink.log(1, {"loss": 1.0})
        puts = s3.puts
        time.sleep(1.5)  # several upload polls and backoffs
        assert s3.puts == puts, "no retry loop against a key another writer holds"
    finally:
        sink.close(budget=1)
    assert sink.spool.pending(), "the chunk stays in the spool"


# --- a disk error under the spool is not a full disk -------------------------------------------------
class KeepingS3:
    """put_object that keeps each body, create-only as the job asks (412 on an existing key)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def put_object(self, **request: Any) -> dict[str, Any]:
        if request["Key"] in self.objects:
            raise ClientError({"Error": {"Code": "PreconditionFailed", "Message": "exists"}}, "PutObject")
        self.objects[request["Key"]] = request["Body"]
        return {}

    def records(self) -> list[contract.Record]:
        return [
            record
            for key in sorted(self.objects)
            if f"/{contract.EVENTS}/" in key  # not the TensorBoard files beside them
            for record in contract.records_of(self.objects[key])
        ]


@pytest.mark.parametrize("call", ["write", "fsync"])
def test_one_eio_on_the_spool_is_retried_and_every_record_lands_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """The old spool raised any OSError as SpoolFullError: one EIO stopped the job with exit 74. A
    failed write leaves half its bytes (a torn tail) and a failed fsync leaves pages the kernel may
    have dropped: both are written again from the last durable size, so no record is lost or doubled."""
    monkeypatch.setattr(spool_writer_module, "SPOOL_DISK_RETRY_S", (0.0,) * 3)  # the retry itself is what counts
    eio = EioOnOpenChunk(call, 2)
    monkeypatch.setattr(os, call, eio)
    s3 = KeepingS3()
    sink = telemetry(tmp_path, s3=s3, cloudwatch=RecordingCloudWatch())
    sink.start()
    for step in range(40):
        sink.log(step, {"loss": 1.0})
        if step == 9:
            assert sink.wait_durable(9, timeout=30), "the first records are durable before the fault"
    assert sink.wait_durable(39, timeout=30), "durable despite the EIO: retried, not given up"
    report = sink.close(budget=10)
    assert eio.injected == 1
    assert sink.lifecycle.fatal is None, "a transient disk error stops nothing"
    assert report.unacknowledged_records == 0 and report.records == 40
    delivered = s3.records()
    assert [r.step for r in delivered] == list(range(40)), "each record once, in order"
    assert [r.seq for r in delivered] == list(range(40))


def test_an_eio_that_persists_stops_the_job_naming_the_spool_and_not_as_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spool_writer_module, "SPOOL_DISK_RETRY_S", (0.0,) * 3)
    eio = EioOnOpenChunk("fsync", 1, persistent=True)
    monkeypatch.setattr(os, "fsync", eio)
    sink = telemetry(tmp_path, s3=KeepingS3(), cloudwatch=RecordingCloudWatch())
    sink.start()
    try:
        sink.log(0, {"loss": 1.0})
        assert sink.spool_writer.done.wait(timeout=30), "the spool thread gives up after its retries"
        with pytest.raises(SpoolDiskError) as stopped:
            sink.log(1, {"loss": 1.0})
        assert not isinstance(stopped.value, SpoolFullError)
        message = str(stopped.value)
        assert "\n" not in message
        assert str(sink.spool.directory) in message and "Input/output error (EIO)" in message
        assert "4 attempts in a row" in message and "not full" in message
        assert eio.injected == 4, "the first attempt and one per retry"
        assert not sink.wait_durable(0, timeout=0), "nothing was claimed durable"
    finally:
        sink.close(budget=1)
