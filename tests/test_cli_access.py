"""The `beacon` command without working AWS access, and its manners (issue 12, items 7 and 11):
one line, exit 2, no traceback; the region order flag > team file > environment; --version, -h,
help that is not cut; --json answers with a JSON error object when the command cannot start."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest

from beacon_ops.aws_access import open_session, resolve_region
from tests.support.synth import ROOT

# No real AWS anywhere: no instance metadata, one attempt, an endpoint nothing listens on.
BARE = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "AWS_EC2_METADATA_DISABLED": "true", "COLUMNS": "80"}
UNREACHABLE = {
    **BARE,
    "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "secret",
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    "AWS_MAX_ATTEMPTS": "1",
}
DOCTOR = ["doctor", "--team", "example", "--run", "r1"]
SMOKE = ["smoke", "--team", "example"]
TENSORBOARD = ["tensorboard", "--team", "example", "--run", "r1", "--no-serve"]


def beacon(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "beacon_ops.cli", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize("argv", [DOCTOR, SMOKE, TENSORBOARD], ids=["doctor", "smoke", "tensorboard"])
def test_an_unknown_profile_is_one_line_and_exit_2(argv: list[str]) -> None:
    line = one_line(beacon(*argv, env={**BARE, "AWS_PROFILE": "no-such-profile"}))
    assert "AWS_PROFILE='no-such-profile' is not a profile" in line


@pytest.mark.parametrize("argv", [DOCTOR, SMOKE, TENSORBOARD], ids=["doctor", "smoke", "tensorboard"])
def test_missing_credentials_say_how_to_provide_them(argv: list[str]) -> None:
    line = one_line(beacon(*argv, env=BARE))
    assert "no AWS credentials found" in line and "aws sso login" in line and "AWS_PROFILE" in line


@pytest.mark.parametrize("argv", [DOCTOR, SMOKE], ids=["doctor", "smoke"])
def test_json_prints_an_error_object_when_the_command_cannot_start(argv: list[str]) -> None:
    done = beacon(*argv, "--json", env=BARE)
    assert done.returncode == 2
    answer = json.loads(done.stdout)
    assert answer["ok"] is False and answer["exit_code"] == 2 and "aws sso login" in answer["error"]


def test_json_error_for_an_unknown_team() -> None:
    done = beacon("doctor", "--team", "nosuch", "--run", "r1", "--json", env=BARE)
    assert done.returncode == 2
    assert "unknown team 'nosuch'" in json.loads(done.stdout)["error"]


def test_the_team_files_region_beats_the_environment_and_the_flag_beats_both() -> None:
    env = {**UNREACHABLE, "AWS_REGION": "us-east-2"}
    assert "in eu-west-1:" in one_line(beacon(*DOCTOR, env=env))  # example.toml's region
    assert "in ap-south-1:" in one_line(beacon(*DOCTOR, "--region", "ap-south-1", env=env))
    assert "(region eu-west-1)" in one_line(beacon(*SMOKE, env=env))
    assert "in eu-west-1:" in one_line(beacon(*TENSORBOARD, env=env))


def test_region_order_in_the_session_opener(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "us-east-2")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    assert resolve_region(flag=None, team_region=None) == "us-east-2"
    assert open_session(region_flag=None, team_region="eu-west-1").region_name == "eu-west-1"
    assert open_session(region_flag="ap-south-1", team_region="eu-west-1").region_name == "ap-south-1"


def test_version_and_short_help() -> None:
    done = beacon("--version", env=BARE)
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert done.returncode == 0 and done.stdout.strip() == f"beacon {declared}", done.stdout
    helped = beacon("-h", env=BARE)
    assert helped.returncode == 0 and "doctor" in helped.stdout, "beacon doctor is findable from the help"
    assert "Usage: beacon smoke" in beacon("smoke", "-h", env=BARE).stdout


def test_help_at_80_columns_cuts_nothing() -> None:
    text = beacon("smoke", "--help", env=BARE).stdout
    assert "…" not in text
    assert "BEACON_KUBERNETES_URL" in text
