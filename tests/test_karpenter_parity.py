"""Karpenter's AWS side against upstream's getting-started template for the pinned version, statement by
statement: the controller policy, the queue policy, the node role and the five EventBridge rules.

The upstream template is vendored in tests/reference/karpenter-1.14.1/ (see its README). Every
difference must be listed in DEVIATIONS with its reason; anything else fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from beacon_constructs.karpenter import CHART_VERSION
from beacon_ops.templates import Resolver
from beacon_ops.templates import Template as SynthesizedTemplate
from config import names
from tests.support.synth import Synthesized

REFERENCE = Path(__file__).parent / "reference" / f"karpenter-{CHART_VERSION}" / "getting-started-cloudformation.yaml"
CLUSTER = "beacon-demo"
NODE_ROLE, QUEUE = "<node role ARN>", "<interruption queue ARN>"

# Upstream statements Beacon deliberately does not reproduce as they are: (where, which) -> why.
DEVIATIONS = {
    ("queue policy", "no unconditioned service send"): (
        "upstream lets any EventBridge rule or SQS queue of any account send to the queue; Beacon relies on the "
        "per-rule statements targets.SqsQueue adds, conditioned on each rule's aws:SourceArn (issue 11, item 5)"
    ),
}
# Differences in shape, not in what is granted.
STRUCTURAL_DEVIATIONS = {
    "six managed policies": "Beacon attaches the same statements as one inline policy on the Pod Identity role",
    "queue name": "CloudFormation names the queue; the chart receives the generated name",
}


# --- reading both sides ----------------------------------------------------------------------
class _CloudFormationLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no stubs
    """YAML with CloudFormation's short-form tags (!Sub, !GetAtt, !Ref) read as their long forms."""


def _intrinsic(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return {"Ref": value} if suffix == "Ref" else {f"Fn::{suffix}": value}


_CloudFormationLoader.add_multi_constructor("!", _intrinsic)


def _attributes(logical_id: str, attribute: str | None) -> str:
    """The same placeholder on both sides for the cluster name, the node role and the queue."""
    if logical_id == "ClusterName":
        return CLUSTER
    if logical_id.startswith("KarpenterNodeRole") and attribute == "Arn":
        return NODE_ROLE
    if logical_id.startswith("KarpenterInterruptionQueue") and attribute == "Arn":
        return QUEUE
    return f"<{logical_id}.{attribute}>"


RESOLVER = Resolver(account="111122223333", region="us-east-1", attributes=_attributes)


def _strings(value: Any) -> list[str]:
    return sorted(str(v) for v in (value if isinstance(value, list) else [value]))


def normalized(statement: dict[str, Any]) -> dict[str, Any]:
    """Order-free: actions, resources and every condition value as sorted lists of strings."""
    resolved = RESOLVER.resolve(statement)
    out: dict[str, Any] = {
        "Effect": resolved["Effect"],
        "Action": _strings(resolved["Action"]),
        "Resource": _strings(resolved["Resource"]),
        "Condition": {
            operator: {key: _strings(value) for key, value in keys.items()}
            for operator, keys in resolved.get("Condition", {}).items()
        },
    }
    if "Principal" in resolved:
        principal = resolved["Principal"]
        out["Principal"] = (
            {kind: _strings(who) for kind, who in principal.items()} if isinstance(principal, dict) else principal
        )
    return out


@pytest.fixture(scope="module")
def upstream() -> dict[str, dict[str, Any]]:
    resources: dict[str, dict[str, Any]] = yaml.load(REFERENCE.read_text(), Loader=_CloudFormationLoader)["Resources"]
    return resources


@pytest.fixture(scope="module")
def cluster(demo: Synthesized) -> SynthesizedTemplate:
    return demo.template("cluster")


def upstream_controller_statements(upstream: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    statements = {}
    for resource in upstream.values():
        if resource["Type"] == "AWS::IAM::ManagedPolicy":
            document = json.loads(RESOLVER.resolve(resource["Properties"]["PolicyDocument"]))
            statements.update({s["Sid"]: normalized(s) for s in document["Statement"]})
    return statements


def beacon_controller_statements(cluster: SynthesizedTemplate) -> dict[str, dict[str, Any]]:
    (policy,) = [p for k, p in cluster.of_type("AWS::IAM::Policy").items() if k.startswith("KarpenterController")]
    return {s["Sid"]: normalized(s) for s in policy["Properties"]["PolicyDocument"]["Statement"]}


# --- the controller policy -------------------------------------------------------------------
def test_the_reference_is_the_pinned_version_and_has_the_upstream_groups(upstream: dict[str, dict[str, Any]]) -> None:
    assert CHART_VERSION == "1.14.1"
    assert len(upstream_controller_statements(upstream)) == 18


def test_controller_policy_grants_exactly_what_upstream_grants_statement_by_statement(
    upstream: dict[str, dict[str, Any]], cluster: SynthesizedTemplate
) -> None:
    theirs, ours = upstream_controller_statements(upstream), beacon_controller_statements(cluster)
    assert sorted(ours) == sorted(theirs), "statement ids differ from upstream"
    for sid, statement in theirs.items():
        assert ours[sid] == statement, f"{sid} differs from upstream v{CHART_VERSION}"


def test_the_three_statements_issue_11_found_match_upstream(cluster: SynthesizedTemplate) -> None:
    """Named, so a regression says which one: zonal shift, ListInstanceProfiles, placement groups."""
    ours = beacon_controller_statements(cluster)
    zonal = ours["AllowZonalShiftStatusReadOnly"]
    assert zonal["Resource"] == ["*"]
    assert zonal["Condition"] == {
        "StringEquals": {
            "arc-zonal-shift:ResourceIdentifier": [f"arn:aws:eks:us-east-1:111122223333:cluster/{CLUSTER}"]
        }
    }
    listing = ours["AllowUnscopedInstanceProfileListAction"]
    assert (listing["Action"], listing["Resource"]) == (["iam:ListInstanceProfiles"], ["*"])
    scoped = ours["AllowScopedEC2InstanceAccessActions"]
    assert "arn:aws:ec2:us-east-1:*:placement-group/*" in scoped["Resource"]


# --- the node role and the queue ---------------------------------------------------------------
def test_node_role_has_upstreams_managed_policies(
    upstream: dict[str, dict[str, Any]], cluster: SynthesizedTemplate
) -> None:
    theirs = _strings(RESOLVER.resolve(upstream["KarpenterNodeRole"]["Properties"]["ManagedPolicyArns"]))
    (role,) = [r for k, r in cluster.of_type("AWS::IAM::Role").items() if k.startswith("KarpenterNodeRole")]
    assert _strings(RESOLVER.resolve(role["Properties"]["ManagedPolicyArns"])) == theirs


def test_node_role_is_named_as_upstream_names_it(
    upstream: dict[str, dict[str, Any]], cluster: SynthesizedTemplate
) -> None:
    """The fixed name is what the image repository's policy (artifacts stack) names, without a reference."""
    theirs = RESOLVER.resolve(upstream["KarpenterNodeRole"]["Properties"]["RoleName"])
    (role,) = [r for k, r in cluster.of_type("AWS::IAM::Role").items() if k.startswith("KarpenterNodeRole")]
    assert RESOLVER.resolve(role["Properties"]["RoleName"]) == theirs == names.karpenter_node_role_name("demo")


def _is_unconditioned_service_send(statement: dict[str, Any]) -> bool:
    return (
        statement["Effect"] == "Allow"
        and "sqs:SendMessage" in statement["Action"]
        and not statement["Condition"]
        and isinstance(statement.get("Principal"), dict)
        and "Service" in statement["Principal"]
    )


def test_queue_keeps_upstreams_retention_encryption_and_tls_deny(
    upstream: dict[str, dict[str, Any]], cluster: SynthesizedTemplate
) -> None:
    theirs = upstream["KarpenterInterruptionQueue"]["Properties"]
    (queue,) = cluster.of_type("AWS::SQS::Queue").values()
    for setting in ("MessageRetentionPeriod", "SqsManagedSseEnabled"):
        assert queue["Properties"][setting] == theirs[setting], setting

    upstream_statements = [
        normalized(s) for s in upstream["KarpenterInterruptionQueuePolicy"]["Properties"]["PolicyDocument"]["Statement"]
    ]
    (policy,) = cluster.of_type("AWS::SQS::QueuePolicy").values()
    ours = [normalized(s) for s in policy["Properties"]["PolicyDocument"]["Statement"]]
    deviating = [s for s in upstream_statements if _is_unconditioned_service_send(s)]
    assert len(deviating) == 1, "the listed deviation must name exactly one upstream statement"
    assert ("queue policy", "no unconditioned service send") in DEVIATIONS
    for statement in upstream_statements:
        if statement in deviating:
            continue
        if statement["Effect"] == "Deny":  # CDK's enforce_ssl denies sqs:* on the queue, like upstream's DenyHTTP
            assert any(
                s["Effect"] == "Deny"
                and s["Action"] == ["sqs:*"]
                and s["Condition"] == {"Bool": {"aws:SecureTransport": ["false"]}}
                for s in ours
            ), statement
        else:
            assert statement in ours, statement


# --- the five EventBridge rules ----------------------------------------------------------------
def test_the_five_rules_match_upstreams_patterns_exactly_and_target_the_queue(
    upstream: dict[str, dict[str, Any]], cluster: SynthesizedTemplate
) -> None:
    """Exact source and detail-type strings: a one-letter typo drops every interruption silently."""
    theirs = sorted(
        json.dumps(r["Properties"]["EventPattern"], sort_keys=True)
        for r in upstream.values()
        if r["Type"] == "AWS::Events::Rule"
    )
    rules = list(cluster.of_type("AWS::Events::Rule").values())
    ours = sorted(json.dumps(r["Properties"]["EventPattern"], sort_keys=True) for r in rules)
    assert len(theirs) == 5
    assert ours == theirs
    (queue_id,) = cluster.of_type("AWS::SQS::Queue")
    for rule in rules:
        (target,) = rule["Properties"]["Targets"]
        assert target["Arn"] == {"Fn::GetAtt": [queue_id, "Arn"]}


def test_every_deviation_has_a_reason() -> None:
    for deviation, reason in [*DEVIATIONS.items(), *STRUCTURAL_DEVIATIONS.items()]:
        assert len(reason) > 20, deviation
