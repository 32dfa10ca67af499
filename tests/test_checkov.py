"""checkov over every synthesized template: each failed check is fixed or acknowledged here, by its
id and the resource it fires on, with a one-line reason (the cdk-nag counterpart is beacon_constructs/nag.py).

checkov pins boto3==1.35.49 exactly (every 3.x release pins one boto3), which conflicts with the
project's boto3 1.44.8; so it runs from its own virtual environment, built by `make test` from
requirements-checkov.txt (CHECKOV below), offline (--skip-download, no Prisma Cloud mapping).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Any

import pytest

from tests.support.synth import ROOT, Synthesized

CHECKOV = ROOT / ".beacon" / "tools" / "checkov-venv" / "bin" / "checkov"
CDK_KUBECTL_FUNCTIONS = r"ClusterKubectlProvider(Handler|frameworkonEvent)[0-9A-F]{8}"
CDK_DEFAULT_SG_FUNCTION = r"CustomVpcRestrictDefaultSGCustomResourceProviderHandler[0-9A-F]{8}"
CDK_KUBECTL_LOG_GROUPS = r"ClusterKubectlProvider(Handler|frameworkonEvent)LogGroup[0-9A-F]{8}"
# CDK's one SDK-call function of the cluster stack: it holds Container Insights' log groups to the team's retention
CDK_SDK_CALL_FUNCTION = r"cluster:AWS::Lambda::Function\.AWS679f53fac002430cb0da5b7982bd2287[0-9A-F]{8}"
VERDICT_FUNCTION = r"monitoring:AWS::Lambda::Function\.AlarmVerdictFunction[0-9A-F]{8}"

# (check id, "<stack>:<resource type>.<logical id>" as a regular expression) -> why it stays.
ACKNOWLEDGED = {
    ("CKV_AWS_115", rf"cluster:AWS::Lambda::Function\.{CDK_KUBECTL_FUNCTIONS}"): (
        "CDK's kubectl handler runs once per deploy; reserved concurrency would only cap CloudFormation's own calls."
    ),
    ("CKV_AWS_116", rf"cluster:AWS::Lambda::Function\.{CDK_KUBECTL_FUNCTIONS}"): (
        "CDK's kubectl handler is invoked synchronously by CloudFormation, which reports failures; a DLQ gets nothing."
    ),
    ("CKV_AWS_173", rf"cluster:AWS::Lambda::Function\.{CDK_KUBECTL_FUNCTIONS}"): (
        "Its environment holds only settings (no secrets); Lambda encrypts it at rest with an AWS key."
    ),
    ("CKV_AWS_115", rf"network:AWS::Lambda::Function\.{CDK_DEFAULT_SG_FUNCTION}"): (
        "CDK's default-security-group handler runs once per deploy, invoked by CloudFormation only."
    ),
    ("CKV_AWS_116", rf"network:AWS::Lambda::Function\.{CDK_DEFAULT_SG_FUNCTION}"): (
        "CDK's default-security-group handler is invoked synchronously by CloudFormation; a DLQ gets nothing."
    ),
    ("CKV_AWS_117", rf"network:AWS::Lambda::Function\.{CDK_DEFAULT_SG_FUNCTION}"): (
        "It calls only the EC2 API to strip the default security group; a VPC would add nothing but endpoints."
    ),
    ("CKV_AWS_158", r"network:AWS::Logs::LogGroup\.NetworkFlowLogs[0-9A-F]{8}"): (
        "Flow-log records hold addresses and ports, no secrets; CloudWatch Logs encrypts them at rest."
    ),
    ("CKV_AWS_158", r"cluster:AWS::Logs::LogGroup\.ClusterControlPlaneLogs[0-9A-F]{8}"): (
        "EKS control-plane logs; CloudWatch Logs encrypts them at rest, secrets are envelope-encrypted with KMS."
    ),
    (
        "CKV_AWS_158",
        rf"cluster:AWS::Logs::LogGroup\.{CDK_KUBECTL_LOG_GROUPS}",
    ): ("CDK's kubectl handler logs; encrypted at rest by CloudWatch Logs, no secrets logged."),
    ("CKV_AWS_158", r"cluster:AWS::Logs::LogGroup\.ClusterContainerInsightsLogsFunctionLogs[0-9A-F]{8}"): (
        "The SDK-call function's own log (log group names and retentions); CloudWatch Logs encrypts it at rest."
    ),
    ("CKV_AWS_115", CDK_SDK_CALL_FUNCTION): (
        "CloudFormation invokes it a few times per deploy; reserving concurrency would take from the account's pool."
    ),
    ("CKV_AWS_116", CDK_SDK_CALL_FUNCTION): (
        "CloudFormation invokes it synchronously and fails the deploy on an error; a DLQ would get nothing."
    ),
    ("CKV_AWS_117", CDK_SDK_CALL_FUNCTION): (
        "It calls only the CloudWatch Logs API (create a log group, set its retention); a VPC would add an endpoint."
    ),
    ("CKV_AWS_115", VERDICT_FUNCTION): (
        "Invoked only by the team's metrics-lost alarms; reserving concurrency takes from the account's pool and "
        "fails on accounts at Lambda's minimum of 10 unreserved."
    ),
    ("CKV_AWS_116", VERDICT_FUNCTION): (
        "EventBridge invokes it asynchronously with 2 retries; a lost verdict loses no alarm: the composite alarm "
        "notifies the topic itself."
    ),
    ("CKV_AWS_117", VERDICT_FUNCTION): (
        "It calls only S3, CloudWatch and SNS public endpoints with its role; a VPC would add an SNS endpoint."
    ),
    ("CKV_AWS_173", VERDICT_FUNCTION): (
        "Its environment holds the team name, bucket name and topic ARN only; Lambda encrypts it at rest."
    ),
    ("CKV_AWS_158", r"monitoring:AWS::Logs::LogGroup\.AlarmVerdictLogs[0-9A-F]{8}"): (
        "The verdict function's logs: no secrets; CloudWatch Logs encrypts them at rest."
    ),
    ("CKV_AWS_18", r"artifacts:AWS::S3::Bucket\.ArtifactStoreAccessLogs[0-9A-F]{8}"): (
        "This is the access-log bucket itself: logging it into itself would loop."
    ),
    ("CKV_AWS_32", r"artifacts:AWS::ECR::Repository\.(Smoke)?ImageRepository[0-9A-F]{8}"): (
        "checkov reads any Principal * as public whatever its Effect; the only one here is the Deny fencing out "
        "every role but the team's (evaluated in test_image_repository.py and test_policies_as_aws_evaluates.py)."
    ),
    ("CKV_AWS_27", r"cluster:AWS::SQS::Queue\.KarpenterInterruptionQueue[0-9A-F]{8}"): (
        "SQS-managed SSE, as upstream Karpenter ships it; a customer key would need every EventBridge rule in its "
        "key policy."
    ),
}


def _where(failed: dict[str, Any]) -> str:
    stack = re.sub(r"^/?beacon-demo-|\.template\.json$", "", failed["file_path"])
    return f"{stack}:{failed['resource']}"


@pytest.fixture(scope="module")
def failed_checks(demo: Synthesized) -> list[dict[str, Any]]:
    if not CHECKOV.exists():
        pytest.fail(f"{CHECKOV} is missing: run `make test` once (it builds checkov's own virtual environment)")
    templates = sorted(p.name for p in demo.outdir.glob("*.template.json"))
    assert len(templates) == 4, templates
    done = subprocess.run(
        [
            str(CHECKOV),
            "--framework",
            "cloudformation",
            "--skip-download",
            "--quiet",
            "--compact",
            "--output",
            "json",
            *(arg for name in templates for arg in ("--file", name)),
        ],
        cwd=demo.outdir,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "LOG_LEVEL": "ERROR"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: some check failed
    report = json.loads(done.stdout)
    (result,) = report if isinstance(report, list) else [report]
    assert result["check_type"] == "cloudformation"
    assert result["summary"]["parsing_errors"] == 0
    assert result["summary"]["resource_count"] > 100, "checkov saw the templates"
    failed: list[dict[str, Any]] = result["results"]["failed_checks"]
    return failed


def test_every_checkov_finding_is_fixed_or_acknowledged(failed_checks: list[dict[str, Any]]) -> None:
    unacknowledged = [
        f"{f['check_id']} {_where(f)}: {f['check_name']}"
        for f in failed_checks
        if not any(check == f["check_id"] and re.fullmatch(pattern, _where(f)) for check, pattern in ACKNOWLEDGED)
    ]
    assert unacknowledged == []


def test_every_acknowledgement_is_still_needed(failed_checks: list[dict[str, Any]]) -> None:
    stale = [
        (check, pattern)
        for check, pattern in ACKNOWLEDGED
        if not any(f["check_id"] == check and re.fullmatch(pattern, _where(f)) for f in failed_checks)
    ]
    assert stale == []
    for reason in ACKNOWLEDGED.values():
        assert len(reason) > 30 and "\n" not in reason
