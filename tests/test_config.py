"""The team model: the demo file loads, and every kind of bad input stops with one line naming file and field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from config import ConfigError, load_team
from tests.synth import ROOT

GOOD = """
team = "{team}"
account = "123456789012"
region = "eu-west-1"
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
    """Append a table, or replace a top-level key (which must stay above every table)."""
    if fragment.startswith("["):
        return f"{base}\n{fragment}\n"
    key = fragment.split("=")[0].strip()
    kept = [line for line in base.splitlines() if not line.startswith(f"{key} ")]
    return "\n".join([*kept, fragment, ""])


BAD_CASES = {
    "malformed_account": ('account = "1234"', "account", "12-digit"),
    "unknown_region": ('region = "mars-north-1"', "region", "not a known AWS region"),
    "negative_gpu_limit": ("[compute]\ngpu_limit = -1", "compute.gpu_limit", "greater than or equal to 0"),
    "zero_cpu_limit": ("[compute]\ngpu_cpu_limit = 0", "compute.gpu_cpu_limit", "greater than 0"),
    "bad_cidr": ('[network]\nvpc_cidr = "10.0.0.0/33"', "network.vpc_cidr", "not an IPv4 CIDR"),
    "public_cidr_range": ('[network]\nvpc_cidr = "8.8.0.0/16"', "network.vpc_cidr", "not a private range"),
    "unknown_key": ("colour = 'blue'", "colour", "unknown key"),
    "unknown_nested_key": ("[monitoring]\nheartbeat = 5", "monitoring.heartbeat", "unknown key"),
    "wrong_type": ('[network]\naz_count = "two"', "network.az_count", "valid integer"),
    "public_endpoint_without_cidrs": (
        '[cluster]\nendpoint_access = "public_and_private"',
        "cluster",
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
        "less than or equal to 30",
    ),
    "bad_email": ('[monitoring]\nalarm_email = "ops-at-example"', "monitoring.alarm_email", "e-mail"),
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
    with pytest.raises(ConfigError, match=rf"^{path}: \(file\): account is required"):
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
