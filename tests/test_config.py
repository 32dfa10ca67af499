"""The team model: the demo file loads, and every kind of bad input stops with one line naming file and field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from config import ConfigError, load_team
from tests.support.synth import ROOT

GOOD = """
team = "{team}"
account = "123456789012"
region = "eu-west-1"

[monitoring]
alarm_email = "ml-oncall@example.com"
"""


def write_team(tmp_path: Path, body: str, team: str = "ml-vision") -> Path:
    path = tmp_path / f"{team}.toml"
    path.write_text(body)
    return path


def test_demo_team_loads_env_agnostic_with_private_endpoint() -> None:
    config = load_team("demo")
    assert config.account is None
    assert config.cluster.endpoint_access == "private"
    assert config.cluster.public_access_cidrs == ()


def test_a_minimal_team_file_gets_safe_defaults(tmp_path: Path) -> None:
    write_team(tmp_path, GOOD.format(team="ml-vision"))
    config = load_team("ml-vision", tmp_path)
    assert config.account == "123456789012"
    assert config.monitoring.heartbeat_interval_seconds <= 30
    assert config.cluster.endpoint_access == "private"


def test_public_endpoint_with_an_allow_list_is_accepted(tmp_path: Path) -> None:
    body = GOOD.format(team="ml-vision") + (
        '[cluster]\nendpoint_access = "public_and_private"\npublic_access_cidrs = ["203.0.113.0/24"]\n'
    )
    write_team(tmp_path, body)
    assert load_team("ml-vision", tmp_path).cluster.public_access_cidrs == ("203.0.113.0/24",)


def with_fragment(base: str, fragment: str) -> str:
    """Append a table (merging into [monitoring]), or replace a top-level key (kept above every table)."""
    if fragment.startswith("[monitoring]"):
        if "alarm_email" in fragment:
            base = "\n".join(line for line in base.splitlines() if not line.startswith("alarm_email"))
        return base.replace("[monitoring]", fragment) + "\n"
    if fragment.startswith("["):
        return f"{base}\n{fragment}\n"
    key = fragment.split("=")[0].strip()
    lines = base.splitlines()
    kept = [line for line in lines if not line.startswith(f"{key} ")]
    first_table = next(i for i, line in enumerate(kept) if line.startswith("["))
    return "\n".join([*kept[:first_table], fragment, *kept[first_table:], ""])


BAD_CASES = {
    "malformed_account": ('account = "1234"', "account", "12-digit"),
    "unknown_region": ('region = "mars-north-1"', "region", "not a known AWS region"),
    "misspelt_region_is_matched": ('region = "eu-wset-1"', "region", "did you mean 'eu-west-1'?"),
    "region_list_comes_from_botocore": ('region = "nowhere-1"', "region", "ap-southeast-6, ap-southeast-7"),
    "negative_gpu_limit": ("[compute]\ngpu_limit = -1", "compute.gpu_limit", "greater than 0"),
    "zero_gpu_limit_says_why": ("[compute]\ngpu_limit = 0", "compute.gpu_limit", "can never start a node"),
    "cidr_18_too_small_for_the_layout": (
        '[network]\nvpc_cidr = "10.0.0.0/18"',
        "network.vpc_cidr",
        "need at least a /17, e.g. 10.0.0.0/17",
    ),
    "cidr_20_too_small_for_the_layout": (
        '[network]\nvpc_cidr = "10.1.16.0/20"',
        "network.vpc_cidr",
        "need at least a /17, e.g. 10.1.0.0/17",
    ),
    "cidr_24_gets_the_same_advice": ('[network]\nvpc_cidr = "10.2.3.0/24"', "network.vpc_cidr", "at least a /17"),
    "cidr_larger_than_aws_allows": ('[network]\nvpc_cidr = "10.0.0.0/8"', "network.vpc_cidr", "/16 at most"),
    "arm64_image_with_amd64_pools": (
        '[training]\nimage_platform = "linux/arm64"',
        "training.image_platform",
        "amd64 nodes only",
    ),
    "uid_0_says_root": ("[training]\nuid = 0", "training.uid", "0 is root"),
    "unquoted_kubernetes_version": (
        "[cluster]\nkubernetes_version = 1.35",
        "cluster.kubernetes_version",
        'quote it, kubernetes_version = "1.35"',
    ),
    "misspelt_key_is_matched": ("[compute]\ngpu_limt = 4", "compute.gpu_limt", "did you mean 'gpu_limit'?"),
    "az_of_another_region": (
        '[network]\navailability_zones = ["us-east-1a", "us-east-1b"]',
        "network.availability_zones",
        "not an AZ of eu-west-1",
    ),
    "three_azs_where_two_exist": ('region = "us-west-1"\n[network]\naz_count = 3', "network.az_count", "offers 2"),
    "bad_topic_arn": (
        '[monitoring]\nalarm_topic_arns = ["arn:aws:sqs:eu-west-1:123456789012:q"]',
        "monitoring.alarm_topic_arns",
        "not an SNS topic ARN",
    ),
    "zero_cpu_limit": ("[compute]\ngpu_cpu_limit = 0", "compute.gpu_cpu_limit", "greater than 0"),
    "bad_cidr": ('[network]\nvpc_cidr = "10.0.0.0/33"', "network.vpc_cidr", "not an IPv4 CIDR"),
    "public_cidr_range": ('[network]\nvpc_cidr = "8.8.0.0/16"', "network.vpc_cidr", "not a private range"),
    "unknown_key": ("colour = 'blue'", "colour", "unknown key; known here: team, account, region, profile"),
    "unknown_nested_key": ("[monitoring]\nheartbeat = 5", "monitoring.heartbeat", "unknown key"),
    "wrong_type": ('[network]\naz_count = "two"', "network.az_count", "valid integer"),
    "public_endpoint_without_cidrs": (
        '[cluster]\nendpoint_access = "public_and_private"',
        "cluster.public_access_cidrs",
        "non-empty public_access_cidrs",
    ),
    "open_to_the_internet": (
        '[cluster]\nendpoint_access = "public_and_private"\npublic_access_cidrs = ["0.0.0.0/0"]',
        "cluster.public_access_cidrs",
        "whole internet",
    ),
    "unknown_kubernetes_version": ('[cluster]\nkubernetes_version = "1.20"', "cluster.kubernetes_version", "supported"),
    "bad_capacity_type": ('[compute]\ncapacity_types = ["reserved"]', "compute.capacity_types.0", "'spot'"),
    "bad_log_retention": ("[monitoring]\nlog_retention_days = 31", "monitoring.log_retention_days", "retention"),
    "heartbeat_too_slow_for_two_minutes": (
        "[monitoring]\nheartbeat_interval_seconds = 90",
        "monitoring.heartbeat_interval_seconds",
        "fires after 120 s without one",
    ),
    "slow_rank_share_under_the_jitter": (
        "[monitoring]\nslow_rank_share = 0.05",
        "monitoring.slow_rank_share",
        "a healthy run's jitter names a rank",
    ),
    "slow_rank_share_as_a_percentage": (
        "[monitoring]\nslow_rank_share = 25",
        "monitoring.slow_rank_share",
        "less than or equal to 0.9",
    ),
    "price_of_no_instance_type": ('[prices]\non_demand = {"a100" = 30.0}', "prices.on_demand", "not an instance type"),
    "price_not_positive": ('[prices]\nspot = {"p5.48xlarge" = 0.0}', "prices.spot.p5.48xlarge", "greater than 0"),
    "bad_email": ('[monitoring]\nalarm_email = "ops-at-example"', "monitoring.alarm_email", "e-mail"),
    # A trailing newline is not part of a name (issue 26, finding 7)
    "email_with_a_newline": ('[monitoring]\nalarm_email = "ops@example.com\\n"', "monitoring.alarm_email", "e-mail"),
    "gpu_family_with_a_newline": (
        '[compute]\ngpu_instance_families = ["g6\\n"]',
        "compute.gpu_instance_families",
        "family",
    ),
    "system_instance_type_with_a_newline": (
        '[cluster]\nsystem_node_instance_type = "m7i.large\\n"',
        "cluster.system_node_instance_type",
        "not an EC2 instance type",
    ),
    "bad_gpu_family": ('[compute]\ngpu_instance_families = ["G5!"]', "compute.gpu_instance_families", "family"),
    "ami_alias_latest_drifts": ('[compute]\nnode_ami_alias = "al2023@latest"', "compute.node_ami_alias", "dated"),
    "ami_alias_not_al2023": ('[compute]\nnode_ami_alias = "bottlerocket@v1.50.0"', "compute.node_ami_alias", "AL2023"),
    "sagemaker_instance_type_without_ml_prefix": (
        '[training]\nsagemaker_instance_type = "m5.xlarge"',
        "training.sagemaker_instance_type",
        "should match pattern",
    ),
    "operator_not_a_role_arn": (
        '[cluster]\noperator_role_arns = ["arn:aws:iam::123456789012:user/alice"]',
        "cluster.operator_role_arns",
        "not an IAM role ARN",
    ),
    "pusher_not_a_role_arn": (
        '[images]\npush_role_arns = ["arn:aws:iam::123456789012:user/ci"]',
        "images.push_role_arns",
        "not an IAM role ARN",
    ),
    "untagged_images_kept_forever": (
        "[images]\nuntagged_expiry_days = 0",
        "images.untagged_expiry_days",
        "greater than or equal to 1",
    ),
    "sagemaker_runtime_too_short": (
        "[training]\nsagemaker_max_runtime_seconds = 60",
        "training.sagemaker_max_runtime_seconds",
        "greater than or equal to 600",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_input_is_one_line_naming_file_and_field(tmp_path: Path, case: str) -> None:
    body, field, words = BAD_CASES[case]
    path = write_team(tmp_path, with_fragment(GOOD.format(team="ml-vision"), body))
    with pytest.raises(ConfigError) as raised:
        load_team("ml-vision", tmp_path)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {field}:"), message
    assert words in message


def test_missing_required_field_is_named(tmp_path: Path) -> None:
    path = write_team(tmp_path, 'team = "ml-vision"\naccount = "123456789012"\n')
    with pytest.raises(ConfigError, match=rf"^{path}: region: required field is missing$"):
        load_team("ml-vision", tmp_path)


def test_account_is_required_except_for_demo(tmp_path: Path) -> None:
    path = write_team(tmp_path, 'team = "ml-vision"\nregion = "us-east-1"\n')
    with pytest.raises(ConfigError, match=rf"^{path}: account: required for every team but 'demo'"):
        load_team("ml-vision", tmp_path)


def test_unknown_team_lists_the_known_ones(tmp_path: Path) -> None:
    write_team(tmp_path, GOOD.format(team="ml-vision"))
    with pytest.raises(ConfigError, match=r"unknown team 'nlp'; known teams: ml-vision$"):
        load_team("nlp", tmp_path)


def test_team_name_must_match_its_file(tmp_path: Path) -> None:
    write_team(tmp_path, GOOD.format(team="other-team"))
    with pytest.raises(ConfigError, match=r"team: 'other-team' does not match the file name 'ml-vision'"):
        load_team("ml-vision", tmp_path)


def test_invalid_toml_is_reported_with_the_file(tmp_path: Path) -> None:
    path = write_team(tmp_path, "team = \n")
    with pytest.raises(ConfigError, match=rf"^{path}: not valid TOML"):
        load_team("ml-vision", tmp_path)


def test_synth_of_an_unknown_team_exits_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "CDK_CONTEXT_JSON": '{"team": "no-such-team"}', "CDK_OUTDIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip() and "!!" not in line]
    assert len(lines) == 1, result.stderr
    assert "unknown team 'no-such-team'" in lines[0]
    assert "Traceback" not in result.stderr


def test_every_error_is_shown_at_once_one_line_each(tmp_path: Path) -> None:
    body = (
        'team = "ml-vision"\naccount = "123456789012"\nregion = "eu-wset-1"\n'
        '[network]\nvpc_cidr = "10.0.0.0/20"\n[compute]\ngpu_limit = 0\n'
        "[monitoring]\nheartbeat_interval_seconds = 300\n[training]\nuid = 0\n"
    )
    path = write_team(tmp_path, body)
    with pytest.raises(ConfigError) as raised:
        load_team("ml-vision", tmp_path)
    lines = raised.value.lines
    assert str(raised.value) == "\n".join(lines)
    fields = [line.removeprefix(f"{path}: ").split(":")[0] for line in lines]
    assert fields == [
        "region",
        "network.vpc_cidr",
        "compute.gpu_limit",
        "monitoring.heartbeat_interval_seconds",
        "training.uid",
    ]


def test_a_team_with_an_account_must_name_an_alarm_destination(tmp_path: Path) -> None:
    path = write_team(tmp_path, 'team = "ml-vision"\naccount = "123456789012"\nregion = "eu-west-1"\n')
    with pytest.raises(ConfigError) as raised:
        load_team("ml-vision", tmp_path)
    assert str(raised.value) == (
        f"{path}: monitoring.alarm_email: alarms would notify nobody; set monitoring.alarm_email = "
        '["oncall@example.com"] or monitoring.alarm_topic_arns = ["arn:aws:sns:<region>:<account>:<topic>"]'
    )


def test_an_existing_topic_is_enough_and_one_email_may_be_a_string(tmp_path: Path) -> None:
    topic = "arn:aws:sns:eu-west-1:123456789012:ml-chat"
    write_team(
        tmp_path,
        f'team = "ml-vision"\naccount = "123456789012"\nregion = "eu-west-1"\n'
        f'[monitoring]\nalarm_topic_arns = ["{topic}"]\n',
    )
    assert load_team("ml-vision", tmp_path).monitoring.alarm_topic_arns == (topic,)
    write_team(tmp_path, GOOD.format(team="ml-vision"))
    assert load_team("ml-vision", tmp_path).monitoring.alarm_email == ("ml-oncall@example.com",)


def test_azs_are_named_from_the_region_or_pinned(tmp_path: Path) -> None:
    write_team(tmp_path, GOOD.format(team="ml-vision"))
    assert load_team("ml-vision", tmp_path).availability_zones() == ("eu-west-1a", "eu-west-1b")
    write_team(
        tmp_path, with_fragment(GOOD.format(team="ml-vision"), 'region = "ap-northeast-1"\n[network]\naz_count = 3')
    )
    assert load_team("ml-vision", tmp_path).availability_zones() == (
        "ap-northeast-1a",
        "ap-northeast-1c",
        "ap-northeast-1d",
    )
    write_team(
        tmp_path,
        with_fragment(GOOD.format(team="ml-vision"), '[network]\navailability_zones = ["eu-west-1b", "eu-west-1c"]'),
    )
    assert load_team("ml-vision", tmp_path).availability_zones() == ("eu-west-1b", "eu-west-1c")


def test_a_17_holds_three_azs_and_the_layout_matches_the_network_construct(tmp_path: Path) -> None:
    from beacon_constructs import network
    from config import model

    assert (model.NAT_SUBNET_MASK, model.NODE_SUBNET_MASK) == (network.NAT_SUBNET_MASK, network.NODE_SUBNET_MASK)
    assert model.smallest_vpc_prefix(2) == model.smallest_vpc_prefix(3) == 17
    write_team(
        tmp_path, with_fragment(GOOD.format(team="ml-vision"), '[network]\nvpc_cidr = "10.9.128.0/17"\naz_count = 3')
    )
    assert load_team("ml-vision", tmp_path).network.vpc_cidr == "10.9.128.0/17"


def test_lean_profile_sets_its_defaults_and_the_team_file_still_wins(tmp_path: Path) -> None:
    lean = with_fragment(GOOD.format(team="ml-vision"), 'profile = "lean"')
    write_team(tmp_path, lean)
    config = load_team("ml-vision", tmp_path)
    assert config.network.extra_endpoints is False
    assert (config.cluster.system_node_count, config.cluster.system_node_instance_type) == (1, "t3.medium")
    assert config.cluster.karpenter_replicas == 1
    write_team(tmp_path, with_fragment(lean, "[cluster]\nkarpenter_replicas = 2"))
    assert load_team("ml-vision", tmp_path).cluster.karpenter_replicas == 2
    write_team(tmp_path, GOOD.format(team="ml-vision"))
    standard = load_team("ml-vision", tmp_path)
    assert (standard.network.extra_endpoints, standard.cluster.system_node_count) == (True, 2)
