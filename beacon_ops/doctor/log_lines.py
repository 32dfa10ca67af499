"""What a container's log says went wrong: its lines, classified into verdicts. Pure: no I/O.

The lines come from CloudWatch Logs (`log_reader.py` reads them): Container Insights' application group, where
each event is Fluent Bit's JSON (`log`, `kubernetes.pod_name`, `kubernetes.container_name`), and SageMaker's
`/aws/sagemaker/TrainingJobs`, plain text in streams `<job>/algo-<n>-<epoch>`. One stream is one container's run,
so its first event is that container's start. Three windows are read: the first 20 s after each start (a job that
cannot reach a service, a credential or a name fails there), the lines at the gap in the run's metrics (from one
heartbeat before its last one: what the job said as its metrics stopped, however long it logged on after), and
the last lines of each stream (what came just before the end).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from beacon_ops.doctor.verdict import FAIL, INFO, OK, Verdict

CHECK = "logs"
START_WINDOW_S = 20.0
TAIL_LINES = 20
# The lines at the gap, from both sides of it: the first GAP_LINES from one heartbeat (15 s) before the last one,
# when what stopped the metrics began (a refused or timed-out put), however fast the job logs on after it; and the
# last GAP_LINES up to one heartbeat after it, where a dying rank's traceback ends.
GAP_LEAD_S = 15.0
GAP_LINES = 40
AT_START, AT_GAP, BEFORE_END = "at-start", "at-gap", "before-end"


def gap_window(gap: datetime) -> tuple[datetime, datetime]:
    """From one heartbeat before the gap to one after: the lines at it are the first GAP_LINES from the start of
    this window and the last GAP_LINES up to its end."""
    return gap - timedelta(seconds=GAP_LEAD_S), gap + timedelta(seconds=GAP_LEAD_S)


QUOTE_LIMIT = 240  # characters of an evidence line: a stack frame or a JSON blob may run to kilobytes


@dataclass(frozen=True)
class LogLine:
    at: datetime
    text: str
    stream: str  # the log stream: one container's run
    source: str = ""  # pod/container for Container Insights; the stream for SageMaker
    pod: str = ""  # Container Insights only: the pod the line came from
    job: str = ""  # Container Insights JSON only: its pod's Job, from the pod's labels


@dataclass(frozen=True)
class LogClass:
    name: str
    pattern: re.Pattern[str]
    fix: str
    status: str = FAIL


def _any(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(alternatives), re.IGNORECASE)


# Most specific first: an NCCL watchdog's timeout is an NCCL error, not a network timeout; a CUDA OOM may say
# "error" and "allocate" in the same line as anything else.
CLASSES: tuple[LogClass, ...] = (
    LogClass(
        "cuda-oom",
        _any(r"CUDA out of memory", r"OutOfMemoryError: CUDA", r"CUBLAS_STATUS_ALLOC_FAILED"),
        "the GPU's memory is too small for this batch: lower the per-device batch size, use gradient accumulation "
        "or activation checkpointing, set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation, "
        "or ask for an instance type with more GPU memory",
    ),
    LogClass(
        "gpu-xid",
        _any(r"NVRM: Xid", r"\bXid\b[^:\n]*:\s*\d+"),
        "the GPU or its driver faulted (an Xid is the driver's error report): the node is suspect, not the code; "
        "cordon and drain it (kubectl cordon <node>; kubectl drain <node> --ignore-daemonsets) so Karpenter "
        "replaces it, or retry the SageMaker job on new instances; Xid 48, 63, 64, 74, 79 and 94 are hardware",
    ),
    LogClass(
        "nccl",
        _any(
            r"NCCL (?:error|WARN)",
            r"nccl(?:System|Internal|Invalid|Remote|UnhandledCuda)Error",
            r"ProcessGroupNCCL",
            r"NCCL communicator was aborted",
        ),
        "a collective failed between ranks: allow all traffic between the job's nodes in their security group "
        "(NCCL picks ports at random), run every rank with NCCL_DEBUG=INFO, and if one rank hung, "
        "TORCH_NCCL_DUMP_ON_TIMEOUT=1 names it; a dead peer shows as a timeout on every other rank",
    ),
    LogClass(
        "access-denied",
        _any(
            r"AccessDenied",
            r"ExpiredToken",
            r"is not authorized to perform",
            r"security token included in the request is (?:expired|invalid)",
            r"UnrecognizedClientException",
        ),
        "the job's identity may not make that call: for EKS, bind the training service account to the team's "
        "writer role (Pod Identity) and remove AWS_ACCESS_KEY_ID/AWS_SESSION_TOKEN from the pod's environment "
        "(static or expired keys win over Pod Identity); for SageMaker, fix the execution role's policy; the "
        "line names the action and the resource",
    ),
    LogClass(
        "dns",
        _any(
            r"Could not resolve host",
            r"Name or service not known",
            r"Temporary failure in name resolution",
            r"nodename nor servname provided",
            r"NXDOMAIN",
            r"getaddrinfo failed",
            r"no such host",
        ),
        "the container cannot resolve the name: check that CoreDNS runs (kubectl -n kube-system get pods "
        "-l k8s-app=kube-dns), that the VPC has DNS support and hostnames on, that an interface endpoint's "
        "private DNS is enabled, and that the name in the line is spelled right (AWS_ENDPOINT_URL, MASTER_ADDR)",
    ),
    LogClass(
        "connection-refused",
        _any(
            r"Connection refused",
            r"ECONNREFUSED",
            r"ConnectionRefusedError",
            r"Connection reset by peer",
            r"ECONNRESET",
            r"ConnectionResetError",
        ),
        "the address answered but nothing listened (refused) or it dropped the connection (reset): for a "
        "rendezvous (MASTER_ADDR:MASTER_PORT) rank 0 is not up yet or the headless Service is missing; for an "
        "endpoint (AWS_ENDPOINT_URL, a proxy, MLflow) check its host and port and that it runs; a reset often "
        "means a security group or a proxy closing the connection",
    ),
    LogClass(
        "timeout",
        _any(
            r"timed out",
            r"TimeoutError",
            r"ConnectTimeout",
            r"ReadTimeout",
            r"deadline exceeded",
            r"timeout (?:error|expired|exceeded)",
        ),
        "a service did not answer in time: from a private subnet, S3, CloudWatch and STS need the VPC's "
        "endpoints or a NAT gateway; check the security groups between the pod and the host in the line",
    ),
)
CLASS_BY_NAME = {c.name: c for c in CLASSES}


def classify(text: str) -> LogClass | None:
    return next((c for c in CLASSES if c.pattern.search(text)), None)


JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # on every pod of a Job; Fluent Bit ships a pod's labels
# Fluent Bit's stream names in Container Insights:
# <host>-application.var.log.containers.<pod>_<namespace>_<container>-<container id>.log
CONTAINER_LOG_STREAM = re.compile(
    r"containers\.(?P<pod>[a-z0-9.-]+)_(?P<namespace>[a-z0-9-]+)_(?P<container>[a-z0-9-]+)-[0-9a-f]+\.log$"
)


def parse_event(message: str, *, stream: str, timestamp_ms: int) -> LogLine:
    """One CloudWatch Logs event: Container Insights' JSON (the line in `log`, its pod and container in
    `kubernetes`), or a plain line as SageMaker and most agents write it."""
    at = datetime.fromtimestamp(timestamp_ms / 1000, UTC)
    text, source, pod, job = message, stream, "", ""
    if named := CONTAINER_LOG_STREAM.search(stream):
        pod = named["pod"]
        source = f"pod {pod}, container {named['container']}"
    if message.startswith("{"):
        try:
            record = json.loads(message)
        except ValueError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("log"), str):
            text = record["log"]
            kubernetes = record.get("kubernetes")
            kubernetes = kubernetes if isinstance(kubernetes, dict) else {}
            pod = str(kubernetes.get("pod_name") or pod)
            labels = kubernetes.get("labels")
            labels = labels if isinstance(labels, dict) else {}
            job = str(labels.get(JOB_NAME_LABEL) or labels.get("job-name") or "")
            container = kubernetes.get("container_name")
            if pod:
                source = f"pod {pod}" + (f", container {container}" if container else "")
    return LogLine(at=at, text=text.rstrip("\r\n"), stream=stream, source=source, pod=pod, job=job)


def quoted(text: str) -> str:
    """The evidence line, trimmed to what a terminal shows: its match is in the first QUOTE_LIMIT characters
    nearly always; a longer one is cut with an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= QUOTE_LIMIT else line[: QUOTE_LIMIT - 1] + "…"


def _by_stream(lines: Iterable[LogLine]) -> dict[str, list[LogLine]]:
    streams: dict[str, list[LogLine]] = {}
    for line in lines:
        streams.setdefault(line.stream, []).append(line)
    for found in streams.values():
        found.sort(key=lambda line: line.at)
    return streams


@dataclass(frozen=True)
class Finding:
    kind: LogClass
    line: LogLine
    after_start_s: float
    window: str  # AT_START (within START_WINDOW_S of its container's start), AT_GAP or BEFORE_END

    def verdict(self, others: int) -> Verdict:
        when = f"{self.line.at:%Y-%m-%d %H:%M:%S} UTC, {self.after_start_s:.0f} s after its container started"
        also = f"; {others} more line(s) of this kind" if others else ""
        return Verdict(
            CHECK,
            self.kind.status,
            f"{self.kind.name}-{self.window}",
            f'{self.line.source}: "{quoted(self.line.text)}" at {when}{also}',
            self.kind.fix,
            at=self.line.at,
        )


def findings(
    lines: Iterable[LogLine],
    *,
    start_window_s: float = START_WINDOW_S,
    tail_lines: int = TAIL_LINES,
    gap: datetime | None = None,
) -> list[Finding]:
    """Every classified line in each stream's first `start_window_s` seconds, at the gap (its first GAP_LINES
    from GAP_LEAD_S before `gap`, its last GAP_LINES up to GAP_LEAD_S after), and in its last `tail_lines`
    lines; a line in several windows counts once, in the first of them."""
    found: list[Finding] = []
    for stream in _by_stream(lines).values():
        started = stream[0].at
        window_end = started + timedelta(seconds=start_window_s)
        start = [line for line in stream if line.at < window_end]
        at_gap: list[LogLine] = []
        if gap is not None:
            since, until = gap_window(gap)
            after = [line for line in stream if line.at >= since][:GAP_LINES]
            before = [line for line in stream if line.at <= until][-GAP_LINES:]
            at_gap = sorted({id(line): line for line in after + before}.values(), key=lambda line: line.at)
        tail = [line for line in stream[-tail_lines:] if line.at >= window_end] if tail_lines else []
        seen: set[int] = set()
        for name, window in ((AT_START, start), (AT_GAP, at_gap), (BEFORE_END, tail)):
            for line in window:
                kind = classify(line.text)
                if kind is not None and id(line) not in seen:
                    seen.add(id(line))
                    found.append(Finding(kind, line, (line.at - started).total_seconds(), name))
    return found


def log_verdicts(
    lines: Sequence[LogLine],
    *,
    where: str,
    start_window_s: float = START_WINDOW_S,
    tail_lines: int = TAIL_LINES,
    gap: datetime | None = None,
) -> list[Verdict]:
    """One verdict per kind of failure and window, its earliest line quoted: start failures first (they explain
    what follows), then what the lines at the gap say, then the last lines; or one verdict saying nothing
    known was found, and where."""
    if not lines:
        return [Verdict(CHECK, INFO, "no log lines", f"no log events for this job in {where}", "")]
    found = findings(lines, start_window_s=start_window_s, tail_lines=tail_lines, gap=gap)
    order = (AT_START, AT_GAP, BEFORE_END)
    first: dict[tuple[str, str], Finding] = {}
    counts: dict[tuple[str, str], int] = {}
    for finding in sorted(found, key=lambda f: (order.index(f.window), f.line.at)):
        key = (finding.kind.name, finding.window)
        first.setdefault(key, finding)
        counts[key] = counts.get(key, 0) + 1
    verdicts = [finding.verdict(counts[key] - 1) for key, finding in first.items()]
    if verdicts:
        return verdicts
    streams = len(_by_stream(lines))
    return [
        Verdict(
            CHECK,
            OK,
            "nothing known",
            f"{len(lines)} line(s) of {streams} container start(s) in {where}: no timeout, refused or reset "
            "connection, denied access, DNS failure, NCCL error, CUDA OOM or Xid in the first "
            f"{start_window_s:g} s"
            + (f", the {2 * GAP_LINES} around the gap ({gap:%Y-%m-%d %H:%M:%S} UTC)" if gap is not None else "")
            + f" nor in the last {tail_lines} lines",
        )
    ]


def unreadable(*, what: str, why: str, fix: str) -> Verdict:
    """What the reader could not read, and how to get it: an INFO, never a failure of the job."""
    return Verdict(CHECK, INFO, "unreadable", f"{what}: {why}", fix)
