"""Whole-app checks on the synthesized templates: cfn-lint, and synth through the real CLI offline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.synth import ROOT, Synthesized

# W3005 (redundant DependsOn) is what CDK's own EKS resources draw; it is harmless there.
IGNORED_CFN_LINT_RULES = ("W3005",)


def test_cfn_lint_finds_no_errors_or_warnings_in_any_template(demo: Synthesized) -> None:
    paths = sorted(str(p) for p in demo.outdir.glob("*.template.json"))
    assert paths
    result = subprocess.run(
        [
            str(ROOT / ".venv/bin/cfn-lint"),
            "--format",
            "parseable",
            "--ignore-checks",
            *IGNORED_CFN_LINT_RULES,
            "--",
            *paths,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_cdk_nag_ran_and_every_acknowledgement_has_a_specific_reason(demo: Synthesized) -> None:
    report = json.loads((demo.outdir / "validation-report.json").read_text())
    (plugin,) = report["pluginReports"]
    assert plugin["pluginName"] == "AwsSolutions"
    assert plugin["conclusion"] == "success"
    assert plugin["violations"] == []
    for suppressed in plugin["suppressedViolations"]:
        assert "[" in suppressed["acknowledgedId"] or suppressed["acknowledgedId"].count("-") >= 1
        assert len(suppressed["reason"]) >= 40, suppressed


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare to cut the network")
def test_cli_synth_of_every_stack_works_with_no_network_at_all(tmp_path: Path, demo: Synthesized) -> None:
    """`cdk synth` under `unshare -n`: a fresh network namespace, with no route anywhere."""
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("unshare -n is not permitted here")
    env = {**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    result = subprocess.run(
        [
            "unshare",
            "-n",
            "npx",
            "--no-install",
            "cdk",
            "synth",
            "--quiet",
            "-c",
            "team=demo",
            "-o",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Unknown option" not in result.stderr
    manifest = json.loads((tmp_path / "manifest.json").read_text())["artifacts"]
    stacks = sorted(name for name, a in manifest.items() if a["type"] == "aws:cloudformation:stack")
    assert stacks == sorted(demo.templates)
    assert all((tmp_path / f"{name}.template.json").is_file() for name in stacks)


def test_the_synth_summary_lists_only_user_facing_outputs(account_team: Synthesized) -> None:
    from stacks.summary import summarize

    outputs = [line for line in summarize(account_team.outdir).splitlines() if "outputs:" in line]
    assert outputs and not any("PublishOutput" in line or "ExportsOutput" in line for line in outputs)
    assert any("BucketName" in line for line in outputs)
