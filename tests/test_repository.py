"""The repository keeps the promises a fresh clone depends on."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support.synth import ROOT


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
    assert re.search(r"beacon_constructs.*shadow", (ROOT / "docs" / "architecture.md").read_text())


def test_python_dependencies_are_pinned_exactly() -> None:
    for name in ("requirements.txt", "requirements-dev.txt", "requirements-checkov.txt", "runtime/requirements.txt"):
        for line in (ROOT / name).read_text().splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "-r")):
                assert "==" in line, f"{name}: {line} is not pinned"


def test_the_cdk_cli_is_pinned_exactly() -> None:
    version = json.loads((ROOT / "package.json").read_text())["devDependencies"]["aws-cdk"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)


def test_training_requirements_carry_nothing_for_cdk() -> None:
    lines = (ROOT / "runtime/requirements.txt").read_text().lower().splitlines()
    packages = {line.split("==")[0] for line in lines if line and not line.startswith("#")}
    assert packages == {"torch", "boto3", "orjson", "tensorboard"}


def test_the_runtime_imports_nothing_of_beacon_outside_itself() -> None:
    forbidden = re.compile(
        r"^\s*(from|import)\s+(aws_cdk|beacon_constructs|beacon_ops|config|stacks|workloads|smoke_job|cdk_nag"
        r"|kubernetes|moto|typer|matplotlib)\b",
        re.M,
    )
    for path in (ROOT / "runtime/beacon").rglob("*.py"):
        assert not forbidden.search(path.read_text()), path


def _wheel_contents(project: Path, package: str, out: Path) -> tuple[set[str], list[str]]:
    """Builds from a copy of what the project declares, so the checkout gets no build/ or egg-info."""
    source = out / "source"
    shutil.copytree(project / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(project / "pyproject.toml", source / "pyproject.toml")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        cwd=out,
    )
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
    return {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}, requires


def test_the_runtime_wheel_carries_the_runtime_alone_and_needs_only_boto3_and_orjson(tmp_path: Path) -> None:
    top_level, requires = _wheel_contents(ROOT / "runtime", "beacon", tmp_path)
    assert top_level == {"beacon"}
    unconditional = [line for line in requires if "extra ==" not in line]
    assert [line.split(":", 1)[1].strip().split(">")[0].split("=")[0] for line in unconditional] == ["boto3", "orjson"]


def test_the_operator_wheel_installs_no_generic_top_level_package(tmp_path: Path) -> None:
    top_level, _ = _wheel_contents(ROOT, "beacon_ops", tmp_path)
    assert top_level == {"beacon_ops"}


def test_the_readmes_layout_table_has_a_row_for_every_source_folder() -> None:
    """Every folder holding the project's Python (tests aside) is a row of the layout table (docs/architecture.md),
    and every folder row names a folder that exists: the table matches the tree."""
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    folders = {
        str(Path(path).parent) + "/"
        for path in tracked.stdout.split()
        if "/" in path and not path.startswith(("tests/", ".")) and Path(path).name != "__main__.py"
    }
    layout = (ROOT / "docs" / "architecture.md").read_text()
    rows = set(re.findall(r"^\| `([^`]+/)` \|", layout, re.MULTILINE))
    assert folders <= rows, sorted(folders - rows)
    assert all((ROOT / row).is_dir() for row in rows), sorted(r for r in rows if not (ROOT / r).is_dir())
