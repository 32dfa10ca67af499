"""Preflight, the job's first seconds: prove every sink works before the first step.

The seed's experience: most lost-metrics cases are the network or S3 write permission, found hours
later. Each check here fails within seconds, with one line that names the bucket and prefix, the
action, the endpoint or the path, and the likely fix.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

from training import contract
from training.config import JobConfig

EPHEMERAL_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "overlay", "devtmpfs", "aufs"})


class PreflightError(Exception):
    """One line: what failed, where, and the likely fix."""


@dataclass(frozen=True)
class PreflightRecord:
    run: str
    experiment: str
    host: str
    pid: int
    world_size: int
    spool_dir: str
    spool_filesystem: str
    spool_persistent: bool
    started_at: str
    team: str
    region: str
    s3_endpoint: str
    namespace: str
    heartbeat_interval: float


def filesystem_of(path: Path) -> tuple[str, str]:
    """(mount point, filesystem type) of the mount holding `path`, from /proc/mounts."""
    resolved = str(path.resolve())
    best = ("/", "unknown")
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            mount_point, fs_type = fields[1], fields[2]
            inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) >= len(best[0]):
                best = (mount_point, fs_type)
    return best


def check_spool(config: JobConfig, spool_dir: Path) -> tuple[str, bool]:
    try:
        spool_dir.mkdir(parents=True, exist_ok=True)
        probe = spool_dir / f".preflight-{uuid.uuid4().hex}"
        with open(probe, "wb") as handle:
            handle.write(b"beacon preflight\n")
            handle.flush()
            os.fsync(handle.fileno())
        probe.unlink()
    except OSError as error:
        raise PreflightError(
            f"spool dir {spool_dir}: cannot create and fsync a file as uid {os.getuid()} ({error.strerror}); "
            "fix the volume's ownership (EFS access point uid/gid, pod fsGroup) or mount it there"
        ) from None
    mount_point, fs_type = filesystem_of(spool_dir)
    persistent = fs_type not in EPHEMERAL_FILESYSTEMS
    if not persistent and not config.allow_ephemeral_spool:
        raise PreflightError(
            f"spool dir {spool_dir} is on {fs_type} ({mount_point}), which does not outlive the pod: "
            "records would be lost with it; mount the persistent artifact volume there"
        )
    return fs_type, persistent


def _endpoint(client: Any) -> str:
    return str(client.meta.endpoint_url)


def _explain(error: BaseException, *, action: str, target: str, client: Any) -> PreflightError:
    if isinstance(error, EndpointConnectionError) or (
        isinstance(error, BotoCoreError) and "connect" in str(error).lower()
    ):
        return PreflightError(
            f"{action} {target}: endpoint {_endpoint(client)} unreachable ({error}); "
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
                f"{action} {target}: not found; deploy the team's monitoring stack or pass --alarms false"
            )
        return PreflightError(f"{action} {target}: {code}: {error.response['Error'].get('Message', '')}")
    return PreflightError(f"{action} {target}: {error} (endpoint {_endpoint(client)})")


def run_preflight(
    config: JobConfig, *, spool_dir: Path, world_size: int, s3: Any, cloudwatch: Any, ssm: Any | None
) -> PreflightRecord:
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
    )
    key = contract.preflight_key(
        config.experiment, config.run, f"{int(time.time() * 1000)}-{uuid.uuid4().hex[:8]}.json"
    )
    target = f"s3://{config.bucket}/{key}"
    body = json.dumps(asdict(record)).encode()
    try:
        s3.put_object(Bucket=config.bucket, Key=key, Body=body, IfNoneMatch="*")
    except (ClientError, BotoCoreError) as error:
        raise _explain(error, action="s3:PutObject", target=target, client=s3) from None
    try:
        echoed = s3.get_object(Bucket=config.bucket, Key=key)["Body"].read()
    except (ClientError, BotoCoreError) as error:
        raise _explain(error, action="s3:GetObject", target=target, client=s3) from None
    if echoed != body:
        raise PreflightError(f"s3:GetObject {target}: read back different bytes than written")
    try:
        cloudwatch.put_metric_data(
            Namespace=config.namespace,
            MetricData=[
                {
                    "MetricName": contract.HEARTBEAT.name,
                    "Dimensions": [
                        {"Name": k, "Value": v}
                        for k, v in contract.run_dimensions(config.team, config.experiment, config.run).items()
                    ],
                    "Value": 1.0,
                    "Unit": contract.HEARTBEAT.unit.value,
                    "StorageResolution": contract.HEARTBEAT.storage_resolution,
                }
            ],
        )
    except (ClientError, BotoCoreError) as error:
        raise _explain(
            error, action="cloudwatch:PutMetricData", target=f"namespace {config.namespace}", client=cloudwatch
        ) from None
    if ssm is not None:
        parameter = contract.run_alarm_parameter_name(config.team)
        try:
            ssm.get_parameter(Name=parameter)
        except (ClientError, BotoCoreError) as error:
            raise _explain(error, action="ssm:GetParameter", target=parameter, client=ssm) from None
    return record
