"""Reads a job's container logs from CloudWatch Logs for the classifier (`log_lines.py`). Never raises.

Per container run (one stream) it reads four pages at most: the head (the first HEAD_EVENTS events, which hold
the first 20 s of any container that is not flooding its log), the lines at the gap in the run's metrics when the
doctor knows one (GAP_LINES on each side of it: two pages), and the tail (the last TAIL_LINES), so a week-long job
costs what a minute-long one does.

- EKS: `/aws/containerinsights/<cluster>/application`. Streams are named after node, pod, namespace and container,
  so they are found by DescribeLogStreams (the most recent first) and by FilterLogEvents on the Job's name from its
  creation on (for a Job long gone), a few pages of each, and kept when their pod is one of the Job's.
- SageMaker: `/aws/sagemaker/TrainingJobs`, streams `<training job>/algo-<n>-<epoch>`, found by DescribeLogStreams
  with that prefix: that group is the account's, and the reader may read only its team's streams in it.

A refusal or a missing group becomes an INFO verdict that says what could not be read and how to read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from beacon_ops.doctor.log_lines import (
    GAP_LINES,
    TAIL_LINES,
    LogLine,
    gap_window,
    log_verdicts,
    parse_event,
    unreadable,
)
from beacon_ops.doctor.verdict import Verdict

HEAD_EVENTS = 500
MAX_STREAMS = 20  # the most recent container runs of one job
DISCOVERY_PAGES = 5  # of FilterLogEvents, to find an EKS job's streams
EMPTY_PAGES = 3  # GetLogEvents pages followed while they come back empty with a new token
REFUSED = ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "ExpiredTokenException")


@dataclass(frozen=True, kw_only=True)
class JobLogs:
    """Where one job's container logs are, and how to tell its streams."""

    platform: str  # eks or sagemaker
    group: str
    job_name: str
    since: datetime | None = None  # EKS: the Job's creation; streams are searched from there
    # EKS: the Job's pods as the orchestrator named them (its pods, and gone ones its events name)
    pods: frozenset[str] = frozenset()
    # EKS: the node each of them ran on, where known: its streams are then found by their exact name's prefix
    placed: tuple[tuple[str, str], ...] = ()
    namespace: str = ""

    def holds(self, line: LogLine) -> bool:
        """A line of one of the Job's pods: by the pod's job-name label when the event carries it (the add-on's
        default Fluent Bit setting leaves labels out); else by the pods the orchestrator named; else by the pod's
        name, `<job>-<random>` or `<job>-<index>-<random>` (an Indexed Job `a` and a Job `a-2` look alike)."""
        if line.job:
            return line.job == self.job_name
        if self.pods:
            return line.pod in self.pods
        return re.fullmatch(rf"{re.escape(self.job_name)}-(?:\d+-)?[a-z0-9]{{5}}", line.pod) is not None

    def by_hand(self) -> str:
        """The command that reads the same lines, for the user to run as an identity that may."""
        if self.platform == "sagemaker":
            return f"aws logs tail {self.group} --log-stream-name-prefix {self.job_name}/ --since 1d"
        return f"aws logs tail {self.group} --filter-pattern '\"{self.job_name}\"' --since 1d"


def eks_job_logs(
    *,
    group: str,
    job_name: str,
    since: datetime | None,
    pods: frozenset[str] = frozenset(),
    placed: dict[str, str] | None = None,
    namespace: str = "",
) -> JobLogs:
    """group: the cluster's Container Insights application group (config.names.container_log_group); placed: pod ->
    node, for the pods whose node is known."""
    return JobLogs(platform="eks", group=group, job_name=job_name, since=since, pods=pods,
                   placed=tuple(sorted((placed or {}).items())), namespace=namespace)  # fmt: skip


def sagemaker_job_logs(*, group: str, training_job_name: str) -> JobLogs:
    """group: the account's SageMaker training-job group (config.names.SAGEMAKER_LOG_GROUP)."""
    return JobLogs(platform="sagemaker", group=group, job_name=training_job_name)


def _refusal(where: JobLogs, error: ClientError | BotoCoreError) -> Verdict:
    code = error.response.get("Error", {}).get("Code", "") if isinstance(error, ClientError) else ""
    what = f"the container logs of {where.job_name} in {where.group}"
    if code == "ResourceNotFoundException":
        if where.platform == "eks":
            fix = (
                "the cluster ships no container logs to CloudWatch: the team's cluster stack installs the "
                "amazon-cloudwatch-observability add-on; until its Fluent Bit runs, read the pod's log with "
                f"kubectl -n <namespace> logs job/{where.job_name}"
            )
        else:
            fix = "the training job wrote no log yet (still provisioning?), or it ran in another region (--region)"
        return unreadable(what=what, why=f"{code}: the log group does not exist", fix=fix)
    if code in REFUSED:
        fix = (
            "run the doctor with the team's reader role (the artifacts stack's ReaderRoleArn, deployed by this "
            "version of Beacon: it may read exactly these logs), or read them as an identity that may: "
            f"{where.by_hand()}"
        )
        return unreadable(what=what, why=f"{code}: {error}", fix=fix)
    return unreadable(what=what, why=str(error), fix=f"check the region and endpoint, or run {where.by_hand()}")


def _streams(logs: Any, where: JobLogs) -> list[str]:
    if where.platform == "sagemaker":
        found = logs.describe_log_streams(logGroupName=where.group, logStreamNamePrefix=f"{where.job_name}/")
        streams = sorted(found.get("logStreams") or [], key=lambda s: s.get("creationTime", 0))
        return [s["logStreamName"] for s in streams][-MAX_STREAMS:]
    names: dict[str, None] = {}
    # Exact first: Container Insights names a container's stream `<node>-application.var.log.containers.<pod>_<ns>_`
    # `<container>-<id>.log` (Fluent Bit's log_stream_prefix is the host name), so a pod whose node is known is one
    # DescribeLogStreams away, however busy the group; the searches below find the pods the events no longer place.
    for pod, node in where.placed[:MAX_STREAMS]:
        prefix = f"{node}-application.var.log.containers.{pod}_{where.namespace}_"
        found = logs.describe_log_streams(logGroupName=where.group, logStreamNamePrefix=prefix)
        names.update((s["logStreamName"], None) for s in found.get("logStreams") or [])
    request: dict[str, Any] = {"logGroupName": where.group, "filterPattern": f'"{where.job_name}"'}
    if where.since is not None:
        request["startTime"] = int(where.since.timestamp() * 1000)
    listing: dict[str, Any] = {"logGroupName": where.group, "orderBy": "LastEventTime", "descending": True}
    for _ in range(DISCOVERY_PAGES):
        page = logs.describe_log_streams(**listing)
        for stream in page.get("logStreams") or []:
            if where.holds(parse_event("", stream=stream["logStreamName"], timestamp_ms=0)):
                names[stream["logStreamName"]] = None
        if not page.get("nextToken"):
            break
        listing["nextToken"] = page["nextToken"]
    for _ in range(DISCOVERY_PAGES):
        page = logs.filter_log_events(**request)
        for event in page.get("events") or []:
            stream = str(event.get("logStreamName", ""))
            line = parse_event(str(event.get("message", "")), stream=stream, timestamp_ms=int(event["timestamp"]))
            if where.holds(line):
                names[stream] = None
        if not page.get("nextToken"):
            break
        request["nextToken"] = page["nextToken"]
    return list(names)[:MAX_STREAMS]  # the listing's newest streams first


def _stream_lines(logs: Any, where: JobLogs, stream: str, gap: datetime | None) -> list[LogLine]:
    """The head, the lines at the gap and the tail of one stream, each event once."""
    events: dict[tuple[int, str], None] = {}
    pages: list[dict[str, Any]] = [{"startFromHead": True, "limit": HEAD_EVENTS}]
    if gap is not None:
        since, until = gap_window(gap)
        pages.append({"startFromHead": True, "limit": GAP_LINES, "startTime": int(since.timestamp() * 1000)})
        pages.append({"startFromHead": False, "limit": GAP_LINES, "endTime": int(until.timestamp() * 1000)})
    pages.append({"startFromHead": False, "limit": TAIL_LINES})
    for page_of in pages:
        request: dict[str, Any] = {"logGroupName": where.group, "logStreamName": stream, **page_of}
        direction = "nextForwardToken" if page_of["startFromHead"] else "nextBackwardToken"
        for _ in range(EMPTY_PAGES):  # CloudWatch may answer an empty page, and a token to go on from
            page = logs.get_log_events(**request)
            found = page.get("events") or []
            for event in found:
                events[(int(event["timestamp"]), str(event.get("message", "")))] = None
            token = page.get(direction)
            if found or not token or token == request.get("nextToken"):
                break
            request["nextToken"] = token
    return [parse_event(message, stream=stream, timestamp_ms=at) for at, message in events]


def read_log_verdicts(logs: Any, where: JobLogs, *, gap: datetime | None = None) -> list[Verdict]:
    """The job's log verdicts, or one INFO verdict saying what could not be read and how to read it. gap: when
    the run's metrics stopped (its last heartbeat), if the doctor knows: the lines at it are read too."""
    try:
        lines = [line for stream in _streams(logs, where) for line in _stream_lines(logs, where, stream, gap)]
        lines = [line for line in lines if not line.job or line.job == where.job_name]  # another Job's, by its label
    except (ClientError, BotoCoreError) as error:
        return [_refusal(where, error)]
    return log_verdicts(lines, where=where.group, gap=gap)
