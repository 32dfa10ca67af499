"""The log classifier, pure: each kind of failure from a real-shaped line, in JSON (Container Insights) and
plain (SageMaker) form; the 20 s start window against the last lines; the quoting of the evidence."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from beacon_ops.doctor.log_lines import (
    CHECK,
    QUOTE_LIMIT,
    LogLine,
    classify,
    log_verdicts,
    parse_event,
    quoted,
)

T0_MS = int(datetime(2026, 12, 1, 10, 0, tzinfo=UTC).timestamp() * 1000)
POD, CONTAINER = "train-0-x7k2p", "train"
STREAM = f"ip-10-0-2-7.ec2.internal-application.var.log.containers.{POD}_training_{CONTAINER}-0123abcd.log"

# One line a kind, as the tools print them (botocore, urllib3, curl, glibc, PyTorch, the NVIDIA driver).
LINES = {
    "timeout": "urllib3.exceptions.ConnectTimeoutError: (<botocore.awsrequest.AWSHTTPConnection>, "
    "'Connection to sts.us-east-1.amazonaws.com timed out. (connect timeout=60)')",
    "connection-refused": "ConnectionRefusedError: [Errno 111] Connection refused",
    "access-denied": "botocore.exceptions.ClientError: An error occurred (AccessDenied) when calling the PutObject "
    "operation: User: arn:aws:sts::123456789012:assumed-role/x/y is not authorized to perform: s3:PutObject",
    "dns": "curl: (6) Could not resolve host: mlflow.internal",
    "nccl": "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system "
    "error, NCCL version 2.21.5",
    "cuda-oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 22.05 GiB of which 1.12 GiB is free.",
    "gpu-xid": "NVRM: Xid (PCI:0000:00:1e): 79, pid=1234, name=python, GPU has fallen off the bus.",
}
MORE = {
    "connection-refused": ["Connection reset by peer", "read ECONNRESET"],
    "access-denied": ["An error occurred (ExpiredToken) when calling the GetCallerIdentity operation"],
    "dns": ["socket.gaierror: [Errno -2] Name or service not known", "Temporary failure in name resolution"],
}


def container_insights(text: str) -> str:
    """A Container Insights application-log event, as Fluent Bit ships it."""
    return json.dumps(
        {
            "log": text + "\n",
            "stream": "stderr",
            "kubernetes": {"pod_name": POD, "namespace_name": "training", "container_name": CONTAINER},
        }
    )


@pytest.mark.parametrize("kind", sorted(LINES))
def test_each_kind_is_recognised_in_a_plain_line(kind: str) -> None:
    found = classify(LINES[kind])
    assert found is not None and found.name == kind
    for other in MORE.get(kind, []):
        again = classify(other)
        assert again is not None and again.name == kind, other


@pytest.mark.parametrize("kind", sorted(LINES))
def test_each_kind_is_recognised_in_a_container_insights_event_and_names_its_pod(kind: str) -> None:
    line = parse_event(container_insights(LINES[kind]), stream=STREAM, timestamp_ms=T0_MS + 3000)
    assert line.text == LINES[kind] and line.source == f"pod {POD}, container {CONTAINER}"
    [verdict] = log_verdicts([line], where="the application group")
    assert verdict.check == CHECK and verdict.status == "fail" and verdict.verdict == f"{kind}-at-start"
    assert verdict.evidence.startswith(f'pod {POD}, container {CONTAINER}: "{quoted(LINES[kind])}" at ')
    assert verdict.fix


def test_an_ordinary_line_is_not_a_failure() -> None:
    for text in ("step 10 loss 0.31", "timeout=30 heartbeat_interval=15", "loading checkpoint from s3://b/x"):
        assert classify(text) is None, text


def test_an_nccl_watchdog_timeout_is_nccl_not_a_network_timeout() -> None:
    line = "[rank1]:[E ProcessGroupNCCL.cpp:607] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)"
    found = classify(line)
    assert found is not None and found.name == "nccl"


def test_a_plain_sagemaker_line_keeps_its_stream_as_source_and_json_that_is_not_fluent_bit_stays_text() -> None:
    plain = parse_event(LINES["dns"], stream="demo-run-r1/algo-1-1764583200", timestamp_ms=T0_MS)
    assert plain.source == "demo-run-r1/algo-1-1764583200" and plain.text == LINES["dns"]
    other = parse_event('{"level": "error", "msg": "x"}', stream="s", timestamp_ms=T0_MS)
    assert other.text == '{"level": "error", "msg": "x"}'


def line(at_s: float, text: str, stream: str = "s/algo-1-1") -> LogLine:
    return parse_event(text, stream=stream, timestamp_ms=T0_MS + int(at_s * 1000))


def test_a_failure_after_the_first_20_s_is_not_a_start_failure() -> None:
    """Connection refused 25 s in, with 30 ordinary lines after it: neither at start nor in the last lines."""
    lines = [line(0, "starting"), line(25, LINES["connection-refused"])]
    lines += [line(26 + i, f"step {i}") for i in range(30)]
    [verdict] = log_verdicts(lines, where="g")
    assert verdict.status == "ok" and verdict.verdict == "nothing known"


def test_a_failure_in_the_last_lines_is_named_as_before_the_end() -> None:
    lines = [line(0, "starting"), *(line(1 + i, f"step {i}") for i in range(40)), line(60, LINES["cuda-oom"])]
    [verdict] = log_verdicts(lines, where="g")
    assert verdict.verdict == "cuda-oom-before-end" and "60 s after its container started" in verdict.evidence


def test_a_failure_at_the_gap_is_found_however_long_the_log_runs_on() -> None:
    """The heartbeat stopped at 100 s; the NCCL error came at 105 s; 50 lines of waiting follow. Without the
    gap nothing is found; with it, the line is named as at the gap, once, even when it is also a last line."""
    lines = [line(0, "starting"), *(line(1 + i, f"step {i}") for i in range(90)), line(105, LINES["nccl"])]
    lines += [line(110 + i, "waiting") for i in range(50)]
    gap = datetime.fromtimestamp(T0_MS / 1000 + 100, UTC)
    [verdict] = log_verdicts(lines, where="g")
    assert verdict.verdict == "nothing known"
    assert "at the gap" not in verdict.evidence
    [verdict] = log_verdicts(lines, where="g", gap=gap)
    assert verdict.verdict == "nccl-at-gap" and "105 s after its container started" in verdict.evidence
    [verdict] = log_verdicts(lines[:-50], where="g", gap=gap)
    assert verdict.verdict == "nccl-at-gap", "in both windows: counted once, at the gap"
    late = log_verdicts(lines, where="g", gap=gap - timedelta(seconds=60))
    assert [v.verdict for v in late] == ["nothing known"], "40 lines from 15 s before the gap, not more"
    assert "the 80 around the gap (2026-12-01 10:00:40 UTC) nor" in late[0].evidence


def test_a_traceback_just_after_the_gap_is_found_behind_a_burst_of_lines_and_a_slow_trickle_after() -> None:
    """500 lines in the 15 s before the gap (the forward page holds 1 s of them), the NCCL error 10 s after the
    last heartbeat, then a thread's "waiting" every 5 s for 8 minutes (the stream's tail): the page read back
    from one heartbeat after the gap holds it."""
    lines = [line(0, "starting"), *(line(85 + i * 0.03, f"step {i}") for i in range(500)), line(110, LINES["nccl"])]
    lines += [line(120 + 5 * i, "waiting for the main thread") for i in range(97)]
    gap = datetime.fromtimestamp(T0_MS / 1000 + 100, UTC)
    [verdict] = log_verdicts(lines, where="g", gap=gap)
    assert verdict.verdict == "nccl-at-gap" and "110 s after its container started" in verdict.evidence


def test_each_container_start_has_its_own_window_and_start_failures_come_first() -> None:
    """A restarted container is a new stream: its own first 20 s count, however late it started."""
    first = [line(0, "up", "a"), line(100, LINES["nccl"], "a")]
    denied = LINES["access-denied"]
    second = [line(300, "up again", "b"), line(305, denied, "b"), line(306, denied, "b")]
    verdicts = log_verdicts([*first, *second], where="g")
    assert [v.verdict for v in verdicts] == ["access-denied-at-start", "nccl-before-end"]
    assert "5 s after its container started; 1 more line(s) of this kind" in verdicts[0].evidence


def test_no_lines_is_info_and_a_long_line_is_trimmed() -> None:
    [verdict] = log_verdicts([], where="/aws/sagemaker/TrainingJobs")
    assert verdict.status == "info" and "/aws/sagemaker/TrainingJobs" in verdict.evidence
    long = LINES["cuda-oom"] + " x" * 500
    assert len(quoted(long)) == QUOTE_LIMIT and quoted(long).endswith("…")
    assert quoted("  a\tb  \n") == "a b"
