"""The one sandbox: an embedded AWS (moto) with a team provisioned from its templates, IAM enforced,
and how a training job is started against it. `beacon local`, the tests and `make bench` use this one."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from beacon_ops.local.moto import ACCOUNT, REGION, EmbeddedAws
from beacon_ops.local.provision import Provisioned, provision_team
from beacon_ops.templates import Template


def aws_env(*, endpoint: str, region: str, credentials: Mapping[str, str]) -> dict[str, str]:
    """What a job needs in its environment to reach the sandbox as an identity."""
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_REGION": region,
        "PYTHONUNBUFFERED": "1",
        "AWS_ACCESS_KEY_ID": credentials["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": credentials["aws_secret_access_key"],
    }
    if "aws_session_token" in credentials:
        env["AWS_SESSION_TOKEN"] = credentials["aws_session_token"]
    return env


def job_args(
    *, bucket: str, spool_dir: Path, checkpoint_dir: Path, heartbeat_file: Path, heartbeat_interval: str
) -> list[str]:
    """The smoke job's arguments for its storage and its beat; the caller adds the rest."""
    return [
        "--bucket",
        bucket,
        "--spool-dir",
        str(spool_dir),
        "--checkpoint-dir",
        str(checkpoint_dir),
        "--heartbeat-file",
        str(heartbeat_file),
        "--heartbeat-interval",
        heartbeat_interval,
        "--flush-interval",
        "1",
    ]


def job_command(args: list[str], *, ranks: int = 1, launcher: str = "") -> list[str]:
    """Plain python for one rank, torchrun for more; launcher="container" is the image's entry point."""
    rest = ["--standalone", f"--nproc-per-node={ranks}", "-m", "smoke_job.train", *args]
    if launcher == "container":
        return [sys.executable, "-m", "beacon.launch", *rest]
    if launcher == "torchrun" or ranks > 1:
        return [str(Path(sys.executable).with_name("torchrun")), *rest]
    return [sys.executable, "-m", "smoke_job.train", *args]


@dataclass
class Sandbox:
    """The embedded AWS with a team provisioned, and the identities it acts as: the writer (what the
    job runs as: `credentials`) and the reader (what the doctor and the verification read with)."""

    aws: EmbeddedAws
    provisioned: Provisioned
    credentials: dict[str, str]
    reader: dict[str, str]
    workdir: Path

    @property
    def bucket(self) -> str:
        return self.provisioned.store.bucket

    def client(self, service: str, credentials: dict[str, str] | None = None) -> Any:
        """A client as the writer, or as the identity given."""
        return self.aws.client(service, **(credentials or self.credentials))

    def job_env(self, credentials: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BEACON_"))}
        env.update(aws_env(endpoint=self.aws.url, region=REGION, credentials=credentials))
        return env


def provision_sandbox(
    aws: EmbeddedAws, templates: dict[str, Template], team: str, *, bucket: str, workdir: Path
) -> Sandbox:
    """Provision team in aws from its templates, switch IAM enforcement on, and take both identities."""
    provisioned = provision_team(templates, team, clients=aws.client, account=ACCOUNT, region=REGION, bucket=bucket)
    aws.enforce_iam()
    sts = aws.client("sts", **provisioned.operator_keys)
    writer = provisioned.writer_credentials(sts)
    reader = provisioned.role_credentials(sts, provisioned.store.reader_role_arn, "beacon-doctor")
    return Sandbox(aws, provisioned, writer, reader, workdir)


def open_sandbox(templates: dict[str, Template], team: str, *, bucket: str, workdir: Path) -> Sandbox:
    """A sandbox on an embedded AWS in a process of its own; stop it with sandbox.aws.stop()."""
    aws = EmbeddedAws.start_process()
    try:
        return provision_sandbox(aws, templates, team, bucket=bucket, workdir=workdir)
    except BaseException:
        aws.stop()
        raise
