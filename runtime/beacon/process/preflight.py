"""Preflight, the job's first seconds: prove every sink works before the first step.

Most lost-metrics cases are the network or S3 write permission, found hours later. Each check here
fails within seconds, with one line that names the bucket and prefix, the action, the endpoint or
the path, and the likely fix. A transient error (5xx, throttling, a reset, a timeout, a refused
connection that clears) is retried within the budget: the Job's podFailurePolicy fails a pod at once
on exit 3, so only a definitive error may end here.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from beacon import contract
from beacon.contract.preflight import PreflightRecord
from beacon.create_only import put_create_only
from beacon.files import READ_ONLY_FIX
from beacon.settings import RunSettings

log = logging.getLogger("beacon.preflight")
T = TypeVar("T")

EPHEMERAL_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "overlay", "devtmpfs", "aufs"})
# Local block filesystems: an emptyDir or hostPath volume is one of these, on the node's own disk.
NODE_DISK_FILESYSTEMS = frozenset({"ext4", "ext3", "xfs", "btrfs"})
# Files the kubelet writes for each pod on the node's disk (where emptyDirs live) and mounts into it.
KUBELET_FILES = ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/dev/termination-log")
PROC_MOUNTS = Path("/proc/mounts")
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)

# Transient errors are retried until PREFLIGHT_BUDGET_S after preflight began (the job then still
# starts within 20 s); a refused connection until it has lasted REFUSED_BUDGET_S (a sidecar or proxy
# that is starting clears within seconds; one that persists is a wrong endpoint).
PREFLIGHT_BUDGET_S = 12.0
REFUSED_BUDGET_S = 6.0
FIRST_RETRY_DELAY_S = 0.25
MAX_RETRY_DELAY_S = 2.0
TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
    }
)


class PreflightError(Exception):
    """One line: what failed, where, and the likely fix."""


@dataclass(frozen=True)
class Mount:
    source: str
    point: str
    fs_type: str


def read_mounts(table: Path = PROC_MOUNTS) -> list[Mount]:
    found = []
    for line in table.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3:
            point = fields[1].replace("\\040", " ")  # /proc/mounts escapes spaces
            found.append(Mount(fields[0], point, fields[2]))
    return found


def mount_of(path: Path, mounts: list[Mount]) -> Mount:
    """The mount holding `path`: the longest mount point containing it (the later one on a tie)."""
    resolved = str(path.resolve())
    best = Mount("unknown", "/", "unknown")
    for mount in mounts:
        inside = resolved == mount.point or resolved.startswith(mount.point.rstrip("/") + "/")
        if inside and len(mount.point) >= len(best.point):
            best = mount
    return best


def filesystem_of(path: Path) -> tuple[str, str]:
    """(mount point, filesystem type) of the mount holding `path`, from /proc/mounts."""
    mount = mount_of(path, read_mounts())
    return mount.point, mount.fs_type


def in_kubernetes() -> bool:
    return "KUBERNETES_SERVICE_HOST" in os.environ


def on_the_nodes_disk(spool: Mount, mounts: list[Mount]) -> bool:
    """An emptyDir or a hostPath: a local filesystem from the same device as the files the kubelet
    mounts into every pod from its own directory on the node's disk. A PersistentVolume is another
    device (EBS) or a network filesystem (EFS: nfs4)."""
    kubelet_sources = {m.source for m in mounts if m.point in KUBELET_FILES}
    return spool.fs_type in NODE_DISK_FILESYSTEMS and spool.source in kubelet_sources


def check_spool(
    config: RunSettings, spool_dir: Path, *, mounts_table: Path = PROC_MOUNTS, kubernetes: bool | None = None
) -> tuple[str, bool]:
    try:
        spool_dir.mkdir(parents=True, exist_ok=True)
        probe = spool_dir / f".preflight-{uuid.uuid4().hex}"
        with open(probe, "wb") as handle:
            handle.write(b"beacon preflight\n")
            handle.flush()
            os.fsync(handle.fileno())
        probe.unlink()
    except OSError as error:
        if error.errno in DISK_FULL:
            raise PreflightError(
                f"spool dir {spool_dir}: disk full ({error.strerror}); free space on the volume or grow it"
            ) from None
        if error.errno == errno.EROFS:
            raise PreflightError(
                f"spool dir {spool_dir}: the volume is mounted read-only ({error.strerror}); {READ_ONLY_FIX}"
            ) from None
        raise PreflightError(
            f"spool dir {spool_dir}: cannot create and fsync a file as uid {os.getuid()} ({error.strerror}); "
            "fix the volume's ownership (EFS access point uid/gid, pod fsGroup) or mount it there"
        ) from None
    mounts = read_mounts(mounts_table)
    spool = mount_of(spool_dir, mounts)
    if spool.fs_type in EPHEMERAL_FILESYSTEMS:
        where = f"{spool.fs_type} ({spool.point})"
    elif (in_kubernetes() if kubernetes is None else kubernetes) and on_the_nodes_disk(spool, mounts):
        where = f"the node's own disk ({spool.source} {spool.fs_type} at {spool.point}: an emptyDir or hostPath)"
    else:
        return spool.fs_type, True
    if not config.allow_ephemeral_spool:
        raise PreflightError(
            f"spool dir {spool_dir} is on {where}, which does not outlive the pod: "
            "records would be lost with it; mount the persistent artifact volume there"
        )
    return spool.fs_type, False


def _endpoint(client: Any) -> str:
    return str(client.meta.endpoint_url)


def _explain(error: BaseException, *, action: str, target: str, client: Any, attempts: int = 1) -> PreflightError:
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    if isinstance(error, EndpointConnectionError) and not resolvable(_endpoint(client)):
        return PreflightError(
            f"{action} {target}: endpoint {_endpoint(client)} unreachable: its host does not resolve; "
            "check AWS_ENDPOINT_URL/AWS_REGION and the VPC's DNS (private endpoints)"
        )
    if isinstance(error, EndpointConnectionError) or (
        isinstance(error, BotoCoreError) and "connect" in str(error).lower()
    ):
        return PreflightError(
            f"{action} {target}: endpoint {_endpoint(client)} unreachable{tries} ({error}); "
            "check AWS_ENDPOINT_URL/AWS_REGION and the VPC endpoints or NAT route"
        )
    if isinstance(error, ClientError):
        code = error.response["Error"]["Code"]
        if code in (
            "AccessDenied",
            "AccessDeniedException",
            "403",
            "InvalidClientTokenId",
            "UnrecognizedClientException",
        ):
            return PreflightError(
                f"{action} {target}: denied ({code}); the job's role lacks this permission: check the training "
                "service account's Pod Identity association with the Beacon writer role"
            )
        if code in ("NoSuchBucket", "404"):
            return PreflightError(
                f"{action} {target}: no such bucket; check --bucket/BEACON_BUCKET against the stack output"
            )
        if code == "ParameterNotFound":
            return PreflightError(
                f"{action} {target}: not found; deploy the team's monitoring stack, or run without the run's alarms "
                "(BEACON_ALARMS=false, or beacon.init(alarms=False))"
            )
        return PreflightError(f"{action} {target}: {code}{tries}: {error.response['Error'].get('Message', '')}")
    return PreflightError(f"{action} {target}: {error}{tries} (endpoint {_endpoint(client)})")


def resolvable(endpoint: str) -> bool:
    parsed = urlparse(endpoint)
    try:
        socket.getaddrinfo(parsed.hostname or "", parsed.port or 443)
    except (socket.gaierror, UnicodeError):
        return False
    return True


def failure_kind(error: BaseException, client: Any) -> str:
    """ "transient" (retry within the budget), "refused" (retry while it is young) or "definitive"."""
    if isinstance(error, ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return "transient" if code in TRANSIENT_CODES or status >= 500 or status == 429 else "definitive"
    if isinstance(error, EndpointConnectionError):
        return "refused" if resolvable(_endpoint(client)) else "definitive"
    if isinstance(error, ConnectionClosedError | ReadTimeoutError | ConnectTimeoutError):
        return "transient"
    return "definitive"


@dataclass
class Retrying:
    """Calls that retry transient errors, all within one budget from preflight's start."""

    budget_s: float = PREFLIGHT_BUDGET_S
    refused_budget_s: float = REFUSED_BUDGET_S
    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    started: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.now()

    def call(self, operation: Callable[[], T], *, action: str, target: str, client: Any) -> T:
        delay, attempts, refused_since = FIRST_RETRY_DELAY_S, 0, None
        while True:
            attempts += 1
            try:
                return operation()
            except (ClientError, BotoCoreError) as error:
                now, kind = self.now(), failure_kind(error, client)
                refused_since = (refused_since or now) if kind == "refused" else None
                out_of_time = now + delay > self.started + self.budget_s or (
                    refused_since is not None and now + delay - refused_since > self.refused_budget_s
                )
                if kind == "definitive" or out_of_time:
                    raise _explain(error, action=action, target=target, client=client, attempts=attempts) from None
                log.warning("%s %s: %s (attempt %d); retrying in %.2f s", action, target, error, attempts, delay)
                self.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY_S)


def _put_once(s3: Any, bucket: str, key: str, body: bytes) -> None:
    """Create the probe; a 412 on a retry means an earlier attempt landed (the key is unique, and
    the read-back compares the bytes)."""
    outcome = put_create_only(s3, bucket=bucket, key=key, body=body, compare=False)
    if outcome.error is not None:
        raise outcome.error


def run_preflight(
    config: RunSettings,
    *,
    spool_dir: Path,
    world_size: int,
    s3: Any,
    cloudwatch: Any,
    ssm: Any | None,
    retrying: Retrying | None = None,
) -> PreflightRecord:
    retrying = retrying or Retrying()
    fs_type, persistent = check_spool(config, spool_dir)
    record = PreflightRecord(
        run=config.run,
        experiment=config.experiment,
        host=socket.gethostname(),
        pid=os.getpid(),
        world_size=world_size,
        spool_dir=str(spool_dir),
        spool_filesystem=fs_type,
        spool_persistent=persistent,
        started_at=datetime.now(UTC).isoformat(),
        team=config.team,
        region=config.region,
        s3_endpoint=_endpoint(s3),
        namespace=config.namespace,
        heartbeat_interval=config.heartbeat_interval,
        stall_dump_after=config.stall_dump_after,
        slow_rank_share=config.slow_rank_share,
    )
    # CloudWatch and the run's alarms first: the record, written last, then says whether this start passed (its
    # write is the probe of the job's S3 rights; a refused write is the error raised, whatever else failed).
    failure: PreflightError | None = None
    try:
        heartbeat = {
            "MetricName": contract.HEARTBEAT.name,
            "Dimensions": [
                {"Name": k, "Value": v}
                for k, v in contract.run_dimensions(config.team, config.experiment, config.run).items()
            ],
            "Value": 1.0,
            "Unit": contract.HEARTBEAT.unit.value,
            "StorageResolution": contract.HEARTBEAT.storage_resolution,
        }
        retrying.call(
            lambda: cloudwatch.put_metric_data(Namespace=config.namespace, MetricData=[heartbeat]),
            action="cloudwatch:PutMetricData",
            target=f"namespace {config.namespace}",
            client=cloudwatch,
        )
        if ssm is not None:
            parameter = contract.run_alarm_parameter_name(config.team)
            retrying.call(
                lambda: ssm.get_parameter(Name=parameter), action="ssm:GetParameter", target=parameter, client=ssm
            )
    except PreflightError as error:
        failure = error
        record = replace(record, failed=str(error)[:1000])
        # The record of a failed start is worth one try, not a second budget: a dead endpoint is named as fast
        retrying = Retrying(budget_s=0.0, refused_budget_s=0.0)
    key = contract.preflight_key(
        config.experiment, config.run, f"{int(time.time() * 1000)}-{uuid.uuid4().hex[:8]}.json"
    )
    target = f"s3://{config.bucket}/{key}"
    body = json.dumps(asdict(record)).encode()
    retrying.call(lambda: _put_once(s3, config.bucket, key, body), action="s3:PutObject", target=target, client=s3)
    echoed = retrying.call(
        lambda: s3.get_object(Bucket=config.bucket, Key=key)["Body"].read(),
        action="s3:GetObject",
        target=target,
        client=s3,
    )
    if echoed != body:
        raise PreflightError(f"s3:GetObject {target}: read back different bytes than written")
    if failure is not None:
        raise failure
    return record
