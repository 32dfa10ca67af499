"""What the Makefile promises offline: account-touching targets need TEAM, and destroy's plan (issue 12, item 4)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from beacon_ops.teardown import Retained, destroy_order, prepare, remains_text, retained_resources
from config import names
from tests.support.synth import ROOT, Synthesized


def make(*args: str) -> subprocess.CompletedProcess[str]:
    # --no-print-directory: under `make test` (CI) this make is nested and would print "make[1]: Entering ..."
    return subprocess.run(
        ["make", "-n", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("goal", ["deploy", "destroy", "diff", "bootstrap"])
def test_account_targets_refuse_to_run_without_team(goal: str) -> None:
    done = make(goal)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert f"make {goal} needs TEAM=<team>" in line and "never defaults to demo" in line
    assert "cdk" not in done.stdout


@pytest.mark.parametrize(
    ("goal", "command"),
    [
        ("deploy", "cdk deploy --all -c team=vision"),
        ("diff", "cdk diff --all -c team=vision"),
        ("bootstrap", "cdk bootstrap -c team=vision"),
    ],
)
def test_account_targets_run_the_cdk_for_the_named_team(goal: str, command: str) -> None:
    done = make(goal, "TEAM=vision")
    assert done.returncode == 0, done.stderr
    assert command in done.stdout


def test_synth_still_defaults_to_the_demo_team() -> None:
    assert "synth --quiet -c team=demo" in make("synth").stdout


def test_destroy_goes_stack_by_stack_in_the_order_the_app_needs(account_team: Synthesized) -> None:
    recipe = make("destroy", "TEAM=vision").stdout
    assert "beacon_ops.teardown prepare --team vision cdk.out" in recipe
    assert "beacon_ops.teardown order cdk.out" in recipe
    assert "destroy --force --exclusively -c team=vision" in recipe
    assert "destroy --all" not in recipe  # it would stop at the termination-protected stack
    order = destroy_order(account_team.outdir)
    assert sorted(order) == sorted(account_team.templates)
    assert order == [f"beacon-vision-{c}" for c in ("cluster", "monitoring", "artifacts", "network")]


def test_destroy_names_what_remains_and_how_to_remove_it(account_team: Synthesized) -> None:
    retained = retained_resources(account_team.outdir)
    kinds = sorted({r.resource_type for r in retained})
    assert kinds == [
        "AWS::ECR::Repository",
        "AWS::EFS::FileSystem",
        "AWS::KMS::Key",
        "AWS::Logs::LogGroup",
        "AWS::S3::Bucket",
    ]
    bucket = Retained("beacon-vision-artifacts", "Bucket", "AWS::S3::Bucket", "beacon-vision-bucket-1")
    images = Retained("beacon-vision-artifacts", "ImageRepository", "AWS::ECR::Repository", "beacon-vision-images-1")
    text = remains_text("vision", [bucket, images])
    assert "aws s3api delete-bucket --bucket beacon-vision-bucket-1" in text
    assert "aws ecr delete-repository --repository-name beacon-vision-images-1 --force" in text
    assert "nothing was retained" in remains_text("vision", [])
    # Outside the stacks: the observability add-on's own groups (issue 25, item 10)
    for text in (remains_text("vision", [bucket, images]), remains_text("vision", [])):
        for group in names.container_insights_log_groups("beacon-vision"):
            assert f"`aws logs delete-log-group --log-group-name {group}`" in text


class FakeCloudFormation:
    def __init__(self) -> None:
        self.protection: list[tuple[str, bool]] = []

    def describe_stack_resource(self, *, StackName: str, LogicalResourceId: str) -> dict[str, Any]:
        return {"StackResourceDetail": {"PhysicalResourceId": f"{LogicalResourceId.lower()}-id"}}

    def update_termination_protection(self, *, EnableTerminationProtection: bool, StackName: str) -> None:
        self.protection.append((StackName, EnableTerminationProtection))


def test_prepare_records_physical_ids_and_lifts_only_the_stateful_stacks_protection(
    account_team: Synthesized,
) -> None:
    cloudformation = FakeCloudFormation()
    retained = prepare(cloudformation, "vision", account_team.outdir)
    assert cloudformation.protection == [("beacon-vision-artifacts", False)]
    assert all(r.physical_id.endswith("-id") for r in retained)
    assert len(retained) == len(retained_resources(account_team.outdir))


# --- What each goal installs (issue 28, item 2) ----------------------------------------------------------------
# distribution: its module
TEST_TOOLCHAIN = {
    "pytest": "pytest", "mypy": "mypy", "ruff": "ruff", "mkdocs-material": "mkdocs", "lightning": "lightning",
    "transformers": "transformers", "mlflow": "mlflow", "wandb": "wandb", "cfn-lint": "cfnlint",
}  # fmt: skip


def required(name: str) -> set[str]:
    """The distributions a requirements file pins, following its `-r` includes."""
    packages: set[str] = set()
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            packages |= required(line[3:].strip())
        elif line:
            packages.add(line.split("==")[0].split("[")[0].lower())
    return packages


def test_make_demo_installs_what_the_demo_needs_and_not_the_test_toolchain() -> None:
    recipe = make("-B", "demo").stdout  # -B: every recipe, as on a fresh clone
    assert "-r requirements-demo.txt" in recipe and "requirements-dev.txt" not in recipe
    assert recipe.rstrip().endswith(".venv/bin/beacon local")
    demo = required("requirements-demo.txt")
    assert {"moto", "torch", "boto3", "typer", "aws-cdk-lib"} <= demo
    assert not demo & set(TEST_TOOLCHAIN), "the demo installs none of the test toolchain"
    pins = [line.split("#")[0].strip() for line in (ROOT / "requirements-demo.txt").read_text().splitlines()]
    assert all("==" in pin for pin in pins if pin and not pin.startswith("-r ")), "pinned exactly"


def test_make_test_adds_the_test_toolchain_to_what_the_demo_installs() -> None:
    recipe = make("-B", "test").stdout
    assert recipe.index("-r requirements-demo.txt") < recipe.index("-r requirements-dev.txt")
    assert required("requirements-demo.txt") | set(TEST_TOOLCHAIN) <= required("requirements-dev.txt")


def test_the_demos_code_imports_nothing_of_the_test_toolchain() -> None:
    """What `make demo` runs (the command, the CDK app, the embedded AWS, the smoke job) runs without it."""
    modules = sorted(TEST_TOOLCHAIN.values())
    probe = (
        "import sys\n"
        "import beacon_ops.cli.main, beacon_ops.local.demo, beacon_ops.local.own_command\n"
        "import smoke_job.train, stacks.beacon_app\n"
        f"print(sorted(m for m in {modules!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
