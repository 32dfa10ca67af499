"""The repository keeps the promises a fresh clone depends on."""

from __future__ import annotations

import json
import re

from tests.synth import ROOT


def test_constructs_package_does_not_shadow_the_constructs_library() -> None:
    assert not (ROOT / "constructs").exists()
    assert (ROOT / "beacon_constructs" / "__init__.py").is_file()
    import constructs

    assert "site-packages" in (constructs.__file__ or "")


def test_cdk_json_turns_off_telemetry_notices_and_version_reporting() -> None:
    cdk = json.loads((ROOT / "cdk.json").read_text())
    assert cdk["context"]["cli-telemetry"] is False
    assert cdk["notices"] is False
    assert cdk["versionReporting"] is False
    flags = [key for key in cdk["context"] if key.startswith("@aws-cdk")]
    assert len(flags) > 50, "the recommended feature flags of `cdk init` are set"


def test_ci_runs_make_test_and_readme_shows_the_two_commands() -> None:
    assert "make test" in (ROOT / ".ci/run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme
    assert "make test" in readme
    assert re.search(r"beacon_constructs.*shadow", readme)


def test_python_dependencies_are_pinned_exactly() -> None:
    for name in ("requirements.txt", "requirements-dev.txt", "requirements-checkov.txt", "training/requirements.txt"):
        for line in (ROOT / name).read_text().splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "-r")):
                assert "==" in line, f"{name}: {line} is not pinned"


def test_the_cdk_cli_is_pinned_exactly() -> None:
    version = json.loads((ROOT / "package.json").read_text())["devDependencies"]["aws-cdk"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)


def test_training_requirements_carry_nothing_for_cdk() -> None:
    lines = (ROOT / "training/requirements.txt").read_text().lower().splitlines()
    packages = {line.split("==")[0] for line in lines if line and not line.startswith("#")}
    assert packages == {"torch", "boto3", "tensorboard"}


def test_training_imports_nothing_of_beacon_outside_training() -> None:
    forbidden = re.compile(r"^\s*(from|import)\s+(aws_cdk|beacon_constructs|beacon|config|stacks|cdk_nag)\b", re.M)
    for path in (ROOT / "training").rglob("*.py"):
        assert not forbidden.search(path.read_text()), path
