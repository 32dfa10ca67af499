"""The typed team model. Every error names the file and the field, in one line."""

from __future__ import annotations

import ipaddress
import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from training import contract
from training.manifests import SmokeJobSpec

TEAMS_DIR = Path(__file__).parent / "teams"
DEMO_TEAM = "demo"

# Commercial regions with EKS, EFS and Karpenter support; a typo here must fail at synth, not deploy.
KNOWN_REGIONS = frozenset(
    {
        "us-east-1",
        "us-east-2",
        "us-west-1",
        "us-west-2",
        "ca-central-1",
        "ca-west-1",
        "sa-east-1",
        "mx-central-1",
        "eu-west-1",
        "eu-west-2",
        "eu-west-3",
        "eu-central-1",
        "eu-central-2",
        "eu-north-1",
        "eu-south-1",
        "eu-south-2",
        "ap-south-1",
        "ap-south-2",
        "ap-southeast-1",
        "ap-southeast-2",
        "ap-southeast-3",
        "ap-southeast-4",
        "ap-southeast-5",
        "ap-southeast-7",
        "ap-northeast-1",
        "ap-northeast-2",
        "ap-northeast-3",
        "ap-east-1",
        "me-south-1",
        "me-central-1",
        "il-central-1",
        "af-south-1",
    }
)
# A kubectl layer is pinned for each version listed here (requirements.txt).
SUPPORTED_KUBERNETES_VERSIONS = ("1.35",)
# The values CloudWatch Logs accepts for RetentionInDays.
LOG_RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)

SLUG = r"^[a-z][a-z0-9-]{1,18}[a-z0-9]$"
INSTANCE_FAMILY = r"^[a-z][a-z0-9-]*[0-9][a-z0-9-]*$"
INSTANCE_TYPE = r"^[a-z][a-z0-9-]*\.[0-9a-z]+$"
EMAIL = r"^[^@\s]+@[^@\s]+\.[^@\s]+$"

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
# TOML arrays arrive as lists; strict mode would refuse them for a tuple.
StrList = Annotated[tuple[str, ...], Field(strict=False)]


class ConfigError(Exception):
    """A team file is unusable; the message is one line naming the file and the field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class NetworkConfig(_Section):
    vpc_cidr: str = "10.40.0.0/16"
    az_count: Annotated[int, Field(ge=2, le=3)] = 2

    @field_validator("vpc_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        try:
            network = ipaddress.IPv4Network(value, strict=True)
        except ValueError as exc:
            raise ValueError(f"not an IPv4 CIDR: {value!r} ({exc})") from None
        if not 16 <= network.prefixlen <= 20:
            raise ValueError(f"prefix /{network.prefixlen} must be between /16 and /20")
        if not network.is_private:
            raise ValueError(f"{value} is not a private range")
        return value


class ClusterConfig(_Section):
    kubernetes_version: str = "1.35"
    endpoint_access: Literal["private", "public_and_private"] = "private"
    public_access_cidrs: StrList = ()
    system_node_instance_type: str = "m7i.large"
    system_node_count: Annotated[int, Field(ge=2, le=5)] = 2
    # IAM roles that may run `beacon smoke`: an access entry each, edit rights in `training` only.
    operator_role_arns: StrList = ()

    @field_validator("operator_role_arns")
    @classmethod
    def _role_arns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for arn in value:
            if not re.fullmatch(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}", arn):
                raise ValueError(f"not an IAM role ARN: {arn!r}")
        return value

    @field_validator("kubernetes_version")
    @classmethod
    def _version(cls, value: str) -> str:
        if value not in SUPPORTED_KUBERNETES_VERSIONS:
            raise ValueError(f"{value!r} is not supported; supported: {', '.join(SUPPORTED_KUBERNETES_VERSIONS)}")
        return value

    @field_validator("public_access_cidrs")
    @classmethod
    def _public_cidrs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for cidr in value:
            try:
                network = ipaddress.ip_network(cidr, strict=True)
            except ValueError:
                raise ValueError(f"not a CIDR: {cidr!r}") from None
            if network.prefixlen == 0:
                raise ValueError(f"{cidr} opens the endpoint to the whole internet")
        return value

    @field_validator("system_node_instance_type")
    @classmethod
    def _instance_type(cls, value: str) -> str:
        if not re.match(INSTANCE_TYPE, value):
            raise ValueError(f"not an EC2 instance type: {value!r}")
        return value

    @model_validator(mode="after")
    def _public_needs_allow_list(self) -> ClusterConfig:
        if self.endpoint_access == "public_and_private" and not self.public_access_cidrs:
            raise ValueError("endpoint_access 'public_and_private' needs a non-empty public_access_cidrs allow-list")
        if self.endpoint_access == "private" and self.public_access_cidrs:
            raise ValueError("public_access_cidrs is set but endpoint_access is 'private'")
        return self


class ComputeConfig(_Section):
    gpu_instance_families: StrList = ("g6", "g5")
    gpu_instance_types: StrList = ()
    capacity_types: Annotated[tuple[Literal["spot", "on-demand"], ...], Field(strict=False)] = ("spot", "on-demand")
    gpu_limit: NonNegativeInt = 8
    gpu_cpu_limit: PositiveInt = 256
    smoke_cpu_limit: PositiveInt = 32

    @field_validator("gpu_instance_families")
    @classmethod
    def _families(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("needs at least one GPU instance family")
        for family in value:
            if not re.match(INSTANCE_FAMILY, family):
                raise ValueError(f"not an EC2 instance family: {family!r}")
        return value

    @field_validator("gpu_instance_types")
    @classmethod
    def _types(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for instance_type in value:
            if not re.match(INSTANCE_TYPE, instance_type):
                raise ValueError(f"not an EC2 instance type: {instance_type!r}")
        return value

    @field_validator("capacity_types")
    @classmethod
    def _capacity(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("needs at least one of 'spot', 'on-demand'")
        if len(set(value)) != len(value):
            raise ValueError("lists a capacity type twice")
        return value


class MonitoringConfig(_Section):
    alarm_email: str | None = None
    log_retention_days: int = 30
    heartbeat_interval_seconds: Annotated[int, Field(ge=1, le=30)] = 15

    @field_validator("alarm_email")
    @classmethod
    def _email(cls, value: str | None) -> str | None:
        if value is not None and not re.match(EMAIL, value):
            raise ValueError(f"not an e-mail address: {value!r}")
        return value

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        if value not in LOG_RETENTION_DAYS:
            raise ValueError(f"{value} is not a CloudWatch Logs retention; use one of {LOG_RETENTION_DAYS}")
        return value


class ArtifactsConfig(_Section):
    noncurrent_version_retention_days: Annotated[int, Field(ge=1, le=3650)] = 90
    abort_incomplete_multipart_days: Annotated[int, Field(ge=1, le=30)] = 7


class TrainingConfig(_Section):
    uid: Annotated[int, Field(ge=1, le=65535)] = 1000
    gid: Annotated[int, Field(ge=1, le=65535)] = 1000
    smoke_steps: Annotated[int, Field(ge=1, le=100_000)] = 200
    smoke_nodes: Annotated[int, Field(ge=1, le=16)] = 1
    smoke_processes_per_node: Annotated[int, Field(ge=1, le=8)] = 1
    image_platform: Literal["linux/amd64", "linux/arm64"] = "linux/amd64"
    # `beacon smoke --target sagemaker`: the same image and entry point as a SageMaker training job.
    sagemaker_instance_type: Annotated[str, Field(pattern=r"^ml\.[a-z0-9]+\.[a-z0-9]+$")] = "ml.m5.xlarge"
    sagemaker_max_runtime_seconds: Annotated[int, Field(ge=600, le=86_400)] = 3600


class TeamConfig(_Section):
    team: str
    account: str | None = None
    region: str
    network: NetworkConfig = NetworkConfig()
    cluster: ClusterConfig = ClusterConfig()
    compute: ComputeConfig = ComputeConfig()
    monitoring: MonitoringConfig = MonitoringConfig()
    artifacts: ArtifactsConfig = ArtifactsConfig()
    training: TrainingConfig = TrainingConfig()

    def smoke_job_spec(self, *, image: str, bucket: str, region: str, name_suffix: str = "") -> SmokeJobSpec:
        """The smoke Job's settings: the cluster stack and `beacon smoke` both build from here."""
        training = self.training
        return SmokeJobSpec(
            team=self.team,
            image=image,
            bucket=bucket,
            region=region,
            uid=training.uid,
            gid=training.gid,
            steps=training.smoke_steps,
            nodes=training.smoke_nodes,
            processes_per_node=training.smoke_processes_per_node,
            heartbeat_interval=self.monitoring.heartbeat_interval_seconds,
            name_suffix=name_suffix,
            min_duration=contract.smoke_min_duration_s(self.monitoring.heartbeat_interval_seconds),
        )

    @field_validator("team")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not re.match(SLUG, value):
            raise ValueError(f"{value!r} is not a slug (3-20 of a-z, 0-9, '-', starting with a letter)")
        if collision := contract.alarm_prefix_collision(value):
            raise ValueError(f"{value!r}: {collision}")
        return value

    @field_validator("account")
    @classmethod
    def _account(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"\d{12}", value):
            raise ValueError(f"{value!r} is not a 12-digit AWS account id")
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if value not in KNOWN_REGIONS:
            raise ValueError(f"{value!r} is not a known AWS region")
        return value

    @model_validator(mode="after")
    def _account_required(self) -> TeamConfig:
        if self.account is None and self.team != DEMO_TEAM:
            raise ValueError("account is required for every team but 'demo'")
        return self


def team_file(team: str, teams_dir: Path = TEAMS_DIR) -> Path:
    return teams_dir / f"{team}.toml"


def _field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(file)"


def _describe(error: dict[str, object]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required field is missing"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def load_team(team: str, teams_dir: Path = TEAMS_DIR) -> TeamConfig:
    """Read and validate one team's file; raise ConfigError with a one-line message."""
    path = team_file(team, teams_dir)
    if not path.is_file():
        known = sorted(p.stem for p in teams_dir.glob("*.toml"))
        raise ConfigError(f"{path}: unknown team {team!r}; known teams: {', '.join(known) or 'none'}")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        config = TeamConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = _field_path(tuple(first["loc"]))
        if first["type"] in ("value_error", "assertion_error") and not first["loc"]:
            field = "(file)"
        raise ConfigError(f"{path}: {field}: {_describe(dict(first))}") from None
    if config.team != path.stem:
        raise ConfigError(f"{path}: team: {config.team!r} does not match the file name {path.stem!r}")
    return config
