"""The typed team model. Every error names the file and the field, in one line."""

from __future__ import annotations

import difflib
import ipaddress
import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

import botocore.loaders
from beacon import contract
from beacon.contract import whole_match
from beacon.contract.goodput import ON_DEMAND, SPOT
from beacon.contract.pace import SLOW_RANK_SHARE, SLOW_RANK_SHARES
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

TEAMS_DIR = Path(__file__).parent / "teams"
DEMO_TEAM = "demo"


def _commercial_regions() -> frozenset[str]:
    """The aws partition's regions from botocore's bundled endpoint data: current, and offline."""
    endpoints = botocore.loaders.create_loader().load_data("endpoints")
    (partition,) = (p for p in endpoints["partitions"] if p["partition"] == "aws")
    return frozenset(partition["regions"])


KNOWN_REGIONS = _commercial_regions()
# Regions whose AZ letters do not start a, b, c (for every account); the rest use a, b, c.
AZ_LETTERS = {"us-west-1": "bc", "ap-northeast-1": "acd", "ca-central-1": "abd"}
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

SLUG = r"[a-z][a-z0-9-]{1,18}[a-z0-9]"
INSTANCE_FAMILY = r"[a-z][a-z0-9-]*[0-9][a-z0-9-]*"
INSTANCE_TYPE = r"[a-z][a-z0-9-]*\.[0-9a-z]+"
EMAIL = r"[^@\s]+@[^@\s]+\.[^@\s]+"

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
# TOML arrays arrive as lists; strict mode would refuse them for a tuple.
StrList = Annotated[tuple[str, ...], Field(strict=False)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


ROLE_ARN = r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}"


def _role_arns(value: tuple[str, ...]) -> tuple[str, ...]:
    for arn in value:
        if not re.fullmatch(ROLE_ARN, arn):
            raise ValueError(f"not an IAM role ARN: {arn!r}")
    return value


# The VPC's subnet layout (beacon_constructs/network.py): per AZ, one public /24 for the NAT gateway,
# then one private /19 for nodes; CDK allocates them in that order, each aligned to its size.
NAT_SUBNET_MASK = 24
NODE_SUBNET_MASK = 19


def _layout_fits(network: ipaddress.IPv4Network, az_count: int) -> bool:
    next_free = int(network.network_address)
    last = int(network.broadcast_address)
    for mask in (NAT_SUBNET_MASK,) * az_count + (NODE_SUBNET_MASK,) * az_count:
        size = 2 ** (32 - mask)
        start = -(-next_free // size) * size  # round up to the subnet's alignment
        if start + size - 1 > last:
            return False
        next_free = start + size
    return True


def smallest_vpc_prefix(az_count: int) -> int:
    """The largest prefix length (smallest VPC) that holds the subnet layout for ``az_count`` AZs."""
    return max(p for p in range(16, 29) if _layout_fits(ipaddress.IPv4Network(f"10.0.0.0/{p}"), az_count))


class NetworkConfig(_Section):
    vpc_cidr: str = "10.40.0.0/16"
    az_count: Annotated[int, Field(ge=2, le=3)] = 2
    # Empty: derived from the region (a, b, c; see AZ_LETTERS). Names only, so synth needs no lookup.
    availability_zones: StrList = ()
    # The interface endpoints beyond the baseline (ec2, eks, ssmmessages, ec2messages): without them
    # those calls ride the NAT gateway. The lean profile turns them off.
    extra_endpoints: bool = True

    @field_validator("vpc_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        try:
            network = ipaddress.IPv4Network(value, strict=True)
        except ValueError as exc:
            raise ValueError(f'not an IPv4 CIDR: {value!r} ({exc}); write it like "10.40.0.0/16"') from None
        if network.prefixlen < 16:
            raise ValueError(f"/{network.prefixlen} is larger than AWS allows for a VPC (/16 at most)")
        if not network.is_private:
            raise ValueError(f"{value} is not a private range; use one in 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16")
        return value

    @model_validator(mode="after")
    def _fits_the_subnet_layout(self) -> NetworkConfig:
        azs = len(self.availability_zones) or self.az_count
        network = ipaddress.IPv4Network(self.vpc_cidr)
        if not _layout_fits(network, azs):
            needed = smallest_vpc_prefix(azs)
            raise ValueError(
                f"vpc_cidr: {self.vpc_cidr} is too small for the subnet layout: {azs} AZs x (a public "
                f"/{NAT_SUBNET_MASK} for NAT + a private /{NODE_SUBNET_MASK} for nodes) need at least a /{needed}, "
                f"e.g. {network.supernet(new_prefix=needed)}"
            )
        return self


class ClusterConfig(_Section):
    kubernetes_version: str = "1.35"
    endpoint_access: Literal["private", "public_and_private"] = "private"
    public_access_cidrs: StrList = ()
    system_node_instance_type: str = "m7i.large"
    system_node_count: Annotated[int, Field(ge=1, le=5)] = 2
    # The Karpenter controller's replicas on the system nodes; 1 saves a node but has no failover.
    karpenter_replicas: Annotated[int, Field(ge=1, le=3)] = 2
    # IAM roles that may run `beacon smoke`: an access entry each, edit rights in `training` only.
    operator_role_arns: StrList = ()
    # An SSM-managed bastion (no SSH, no public IP) to port-forward to the private API endpoint.
    bastion: bool = False

    @field_validator("operator_role_arns")
    @classmethod
    def _operator_role_arns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _role_arns(value)

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
        if not whole_match(INSTANCE_TYPE, value):
            raise ValueError(f"not an EC2 instance type: {value!r}")
        return value

    @model_validator(mode="after")
    def _public_needs_allow_list(self) -> ClusterConfig:
        if self.endpoint_access == "public_and_private" and not self.public_access_cidrs:
            raise ValueError(
                "public_access_cidrs: endpoint_access 'public_and_private' needs a non-empty public_access_cidrs "
                'allow-list, e.g. ["203.0.113.0/24"] (your office or VPN egress)'
            )
        if self.endpoint_access == "private" and self.public_access_cidrs:
            raise ValueError(
                "public_access_cidrs: set, but endpoint_access is 'private'; remove it or set endpoint_access"
            )
        return self


class ComputeConfig(_Section):
    gpu_instance_families: StrList = ("g6", "g5")
    gpu_instance_types: StrList = ()
    capacity_types: Annotated[tuple[Literal["spot", "on-demand"], ...], Field(strict=False)] = ("spot", "on-demand")
    # The GPU pool's cap in GPUs; 0 would make a pool that can never start a node, so it is refused.
    gpu_limit: PositiveInt = 8
    gpu_cpu_limit: PositiveInt = 256
    smoke_cpu_limit: PositiveInt = 32
    # Karpenter nodes' AMI: a dated AL2023 alias; @latest would replace every node on each AMI release.
    node_ami_alias: str = "al2023@v20260818"

    @field_validator("node_ami_alias")
    @classmethod
    def _ami_alias(cls, value: str) -> str:
        if not re.fullmatch(r"al2023@v\d{8}", value):
            raise ValueError(f"{value!r} is not a dated AL2023 alias like 'al2023@v20260818' (never @latest)")
        return value

    @field_validator("gpu_instance_families")
    @classmethod
    def _families(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("needs at least one GPU instance family")
        for family in value:
            if not whole_match(INSTANCE_FAMILY, family):
                raise ValueError(f"not an EC2 instance family: {family!r}")
        return value

    @field_validator("gpu_instance_types")
    @classmethod
    def _types(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for instance_type in value:
            if not whole_match(INSTANCE_TYPE, instance_type):
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
    # Where alarms go: e-mail addresses (each confirms a subscription mail), and/or existing SNS topics
    # (a chat webhook, AWS Chatbot, a pager) that CloudWatch may publish to.
    alarm_email: StrList = ()
    alarm_topic_arns: StrList = ()
    log_retention_days: int = 30
    heartbeat_interval_seconds: Annotated[int, Field(ge=1, le=30)] = contract.HEARTBEAT_INTERVAL_S
    # A rank is slow once the others wait for it this share of each step (`beacon.contract.pace`): the run's slow
    # alarm, its heartbeat and the doctor read this one number (the Job's BEACON_SLOW_RANK_SHARE, its preflight record).
    slow_rank_share: Annotated[float, Field(ge=SLOW_RANK_SHARES[0], le=SLOW_RANK_SHARES[1])] = SLOW_RANK_SHARE

    @field_validator("alarm_email", mode="before")
    @classmethod
    def _one_email_is_a_list(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("alarm_email")
    @classmethod
    def _email(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for email in value:
            if not whole_match(EMAIL, email):
                raise ValueError(f"not an e-mail address: {email!r}")
        return value

    @field_validator("alarm_topic_arns")
    @classmethod
    def _topic_arns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for arn in value:
            if not re.fullmatch(r"arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[\w-]{1,256}", arn):
                raise ValueError(f"not an SNS topic ARN: {arn!r} (arn:aws:sns:<region>:<account>:<name>)")
        return value

    @property
    def notifies_someone(self) -> bool:
        return bool(self.alarm_email or self.alarm_topic_arns)

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        if value not in LOG_RETENTION_DAYS:
            raise ValueError(f"{value} is not a CloudWatch Logs retention; use one of {LOG_RETENTION_DAYS}")
        return value


class ArtifactsConfig(_Section):
    noncurrent_version_retention_days: Annotated[int, Field(ge=1, le=3650)] = 90
    abort_incomplete_multipart_days: Annotated[int, Field(ge=1, le=30)] = 7
    # Roles that may take the reader role (`beacon doctor`, `beacon tensorboard`, dashboards) beside
    # cluster.operator_role_arns; when neither names one, roles of the account tagged `beacon-reader-<team> = true`.
    reader_role_arns: StrList = ()

    @field_validator("reader_role_arns")
    @classmethod
    def _reader_role_arns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _role_arns(value)


class ImagesConfig(_Section):
    """The team's image repository (docs/images.md)."""

    # Roles that push images (a CI pipeline, an operator); with the node and writer roles, the only
    # principals the repository lets pull or push. Each must exist before the deploy.
    push_role_arns: StrList = ()
    untagged_expiry_days: Annotated[int, Field(ge=1, le=365)] = 14

    @field_validator("push_role_arns")
    @classmethod
    def _push_role_arns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _role_arns(value)


class TrainingConfig(_Section):
    uid: Annotated[int, Field(ge=1, le=65535)] = 1000
    gid: Annotated[int, Field(ge=1, le=65535)] = 1000
    smoke_steps: Annotated[int, Field(ge=1, le=100_000)] = 200
    smoke_nodes: Annotated[int, Field(ge=1, le=16)] = 1
    smoke_processes_per_node: Annotated[int, Field(ge=1, le=8)] = 1
    image_platform: Literal["linux/amd64", "linux/arm64"] = "linux/amd64"

    @field_validator("image_platform")
    @classmethod
    def _platform_the_pools_run(cls, value: str) -> str:
        if value != "linux/amd64":
            raise ValueError(
                f"{value!r}: the Karpenter pools launch amd64 nodes only, so a {value} image would never start; "
                'use "linux/amd64"'
            )
        return value

    # `beacon smoke --target sagemaker`: the same image and entry point as a SageMaker training job.
    sagemaker_instance_type: Annotated[str, Field(pattern=r"^ml\.[a-z0-9]+\.[a-z0-9]+$")] = "ml.m5.xlarge"
    sagemaker_max_runtime_seconds: Annotated[int, Field(ge=600, le=86_400)] = 3600


# What `profile = "lean"` changes, unless the team file sets the key itself (docs/cost.md).
LEAN_PROFILE: dict[str, dict[str, object]] = {
    "network": {"extra_endpoints": False},
    "cluster": {"system_node_count": 1, "system_node_instance_type": "t3.medium", "karpenter_replicas": 1},
}


class PricesConfig(_Section):
    # The team's own hourly prices (USD) by instance type, e.g. negotiated rates or its usual spot price; the doctor's
    # cost, the alarm's mail and `beacon goodput` take them over the dated list prices (`beacon.contract.goodput`).
    on_demand: dict[str, Annotated[float, Field(gt=0)]] = {}
    spot: dict[str, Annotated[float, Field(gt=0)]] = {}

    @field_validator("on_demand", "spot")
    @classmethod
    def _instance_types(cls, value: dict[str, float]) -> dict[str, float]:
        for instance_type in value:
            if not whole_match(rf"(ml\.)?{INSTANCE_TYPE}", instance_type):
                raise ValueError(f"not an instance type: {instance_type!r} (p5.48xlarge, ml.g5.xlarge)")
        return value

    def table(self) -> dict[str, dict[str, float]]:
        """As `contract.goodput.cost_of` takes them."""
        return {ON_DEMAND: dict(self.on_demand), SPOT: dict(self.spot)}


class TeamConfig(_Section):
    team: str
    account: str | None = None
    region: str
    profile: Literal["standard", "lean"] = "standard"
    network: NetworkConfig = NetworkConfig()
    cluster: ClusterConfig = ClusterConfig()
    compute: ComputeConfig = ComputeConfig()
    monitoring: MonitoringConfig = MonitoringConfig()
    artifacts: ArtifactsConfig = ArtifactsConfig()
    images: ImagesConfig = ImagesConfig()
    training: TrainingConfig = TrainingConfig()
    prices: PricesConfig = PricesConfig()

    @model_validator(mode="before")
    @classmethod
    def _profile_defaults(cls, raw: object) -> object:
        if not isinstance(raw, dict) or raw.get("profile") != "lean":
            return raw
        merged = dict(raw)
        for section, defaults in LEAN_PROFILE.items():
            given = merged.get(section, {})
            if isinstance(given, dict):
                merged[section] = {**defaults, **given}
        return merged

    def availability_zones(self) -> tuple[str, ...]:
        """The VPC's AZs by name: pinned in the team file, or the region's first ``az_count``."""
        if self.network.availability_zones:
            return self.network.availability_zones
        letters = AZ_LETTERS.get(self.region, "abc")
        return tuple(f"{self.region}{letter}" for letter in letters[: self.network.az_count])

    @field_validator("team")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not whole_match(SLUG, value):
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
            close = difflib.get_close_matches(value, KNOWN_REGIONS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"{value!r} is not a known AWS region; {hint}known: {', '.join(sorted(KNOWN_REGIONS))}")
        return value

    @model_validator(mode="after")
    def _account_required(self) -> TeamConfig:
        if self.account is None and self.team != DEMO_TEAM:
            raise ValueError(
                "account: required for every team but 'demo': the 12-digit account to deploy into "
                "(aws sts get-caller-identity --query Account)"
            )
        return self

    @model_validator(mode="after")
    def _alarms_notify_someone(self) -> TeamConfig:
        if self.account is not None and not self.monitoring.notifies_someone:
            raise ValueError(
                "monitoring.alarm_email: alarms would notify nobody; set monitoring.alarm_email = "
                '["oncall@example.com"] or monitoring.alarm_topic_arns = ["arn:aws:sns:<region>:<account>:<topic>"]'
            )
        return self

    @model_validator(mode="after")
    def _zones_in_region(self) -> TeamConfig:
        pinned = self.network.availability_zones
        letters = AZ_LETTERS.get(self.region, "abc")
        if not pinned and self.network.az_count > len(letters):
            raise ValueError(
                f"network.az_count: {self.region} offers {len(letters)} AZs to every account; set az_count = "
                f"{len(letters)}, or pin network.availability_zones"
            )
        for zone in pinned:
            if not re.fullmatch(rf"{re.escape(self.region)}[a-z]", zone):
                raise ValueError(
                    f"network.availability_zones: {zone!r} is not an AZ of {self.region}; "
                    f'write names like "{self.region}a"'
                )
        if pinned and not 2 <= len(pinned) <= 3:
            raise ValueError("network.availability_zones: pin 2 or 3 AZs")
        if pinned and len(set(pinned)) != len(pinned):
            raise ValueError("network.availability_zones: lists an AZ twice")
        return self


def team_file(team: str, teams_dir: Path = TEAMS_DIR) -> Path:
    return teams_dir / f"{team}.toml"


class ConfigError(Exception):
    """A team file is unusable: one line per problem, each naming the file and the field."""

    def __init__(self, lines: list[str] | str) -> None:
        self.lines = [lines] if isinstance(lines, str) else lines
        super().__init__("\n".join(self.lines))


# Why a limit exists and what to write instead, for the fields whose bare bound says too little.
WHY = {
    "training.uid": "0 is root: the job and its volume run as a non-root user; use 1000 or your image's user id",
    "training.gid": "0 is root's group: use 1000 or your image's group id",
    "monitoring.heartbeat_interval_seconds": (
        "the silent alarm counts beats in 30 s periods and fires after 120 s without one, so a slower "
        f"heartbeat leaves periods empty and raises false alarms; use {contract.HEARTBEAT_INTERVAL_S} (the default)"
    ),
    "monitoring.slow_rank_share": (
        f"the share of each step the other ranks wait for the slowest: under {SLOW_RANK_SHARES[0]} a healthy run's "
        f"jitter names a rank, over {SLOW_RANK_SHARES[1]} only a hang would; {SLOW_RANK_SHARE} (the default) names a "
        "rank about 1.33x slower than the others"
    ),
    "compute.gpu_limit": "a limit of 0 makes a GPU pool that can never start a node; set the most GPUs to run at once",
}
_FIELD_PREFIX = re.compile(r"^([a-z_]+(?:\.[a-z_]+)*): ")


def _section_fields(loc: tuple[int | str, ...]) -> list[str]:
    """The keys allowed where ``loc`` points, for "did you mean"."""
    model: type[BaseModel] = TeamConfig
    for part in loc[:-1]:
        annotation = model.model_fields[str(part)].annotation if str(part) in model.model_fields else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def _error_line(error: ErrorDetails) -> tuple[str, str]:
    """(field, reason and fix) for one pydantic error."""
    loc = tuple(error["loc"])
    field = ".".join(str(part) for part in loc)
    kind = error["type"]
    message = str(error["msg"]).removeprefix("Value error, ")
    if kind in ("value_error", "assertion_error") and (match := _FIELD_PREFIX.match(message)):
        inner = match.group(1)
        field = inner if "." in inner or not field else f"{field}.{inner}"
        message = message[match.end() :]
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), _section_fields(loc), n=1, cutoff=0.7)
        known = ", ".join(_section_fields(loc))
        message = f"unknown key; did you mean {close[0]!r}?" if close else f"unknown key; known here: {known}"
    elif kind == "missing":
        message = "required field is missing"
    elif kind == "string_type" and isinstance(error.get("input"), int | float):
        value = error["input"]
        message = f'{message}: quote it, {loc[-1]} = "{value}" (unquoted, TOML reads {value} as a number)'
    elif field in WHY and kind not in ("value_error",):
        message = f"{message}: {WHY[field]}"
    return field or "(file)", message


def parse_team(raw: dict[str, object], path: Path) -> TeamConfig:
    """Validate one team's settings; raise ConfigError listing every problem, one line each."""
    lines: list[str] = []
    config: TeamConfig | None = None
    try:
        config = TeamConfig.model_validate(raw)
    except ValidationError as exc:
        lines.extend(f"{path}: {field}: {why}" for field, why in map(_error_line, exc.errors()))
    if isinstance(raw.get("team"), str) and raw["team"] != path.stem:
        lines.append(f"{path}: team: {raw['team']!r} does not match the file name {path.stem!r}")
    if lines or config is None:
        raise ConfigError(lines)
    return config


def load_team(team: str, teams_dir: Path = TEAMS_DIR) -> TeamConfig:
    """Read and validate one team's file; raise ConfigError, one line per problem."""
    path = team_file(team, teams_dir)
    if not path.is_file():
        known = sorted(p.stem for p in teams_dir.glob("*.toml"))
        raise ConfigError(f"{path}: unknown team {team!r}; known teams: {', '.join(known) or 'none'}")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_team(raw, path)
