"""The policy evaluator itself, on hand-written policies whose AWS outcome the IAM docs state."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.policy_eval import (
    Decision,
    PolicyDoc,
    PolicyEvalError,
    PolicyKind,
    Request,
    arn_match,
    evaluate,
    wildcard_match,
)

ROLE = "arn:aws:iam::111122223333:role/writer"
OTHER_ACCOUNT_ROLE = "arn:aws:iam::444455556666:role/writer"
ROOT = "arn:aws:iam::111122223333:root"
BUCKET_OBJECTS = "arn:aws:s3:::b/*"


def identity(*statements: dict[str, Any]) -> PolicyDoc:
    return PolicyDoc.of(PolicyKind.IDENTITY, {"Statement": list(statements)})


def resource(*statements: dict[str, Any]) -> PolicyDoc:
    return PolicyDoc.of(PolicyKind.RESOURCE, {"Statement": list(statements)})


def key(*statements: dict[str, Any]) -> PolicyDoc:
    return PolicyDoc.of(PolicyKind.KEY, {"Statement": list(statements)})


def allow(**extra: Any) -> dict[str, Any]:
    return {"Effect": "Allow", "Action": "s3:PutObject", "Resource": BUCKET_OBJECTS, **extra}


def deny(**extra: Any) -> dict[str, Any]:
    return {**allow(**extra), "Effect": "Deny"}


def put(key_name: str = "experiments/e/r/events/c", principal: str | None = ROLE, **context: Any) -> Request:
    return Request("s3:PutObject", f"arn:aws:s3:::b/{key_name}", principal, context)


def test_implicit_deny_without_any_allow() -> None:
    assert evaluate([], put()) is Decision.IMPLICIT_DENY


def test_explicit_deny_beats_allow() -> None:
    assert evaluate([identity(allow()), resource(deny(Principal="*"))], put()) is Decision.EXPLICIT_DENY


def test_wildcard_crosses_slashes() -> None:
    assert wildcard_match("experiments/*/*/tensorboard/*", "experiments/e/r/sagemaker-volume/x/tensorboard/f")
    assert not wildcard_match("experiments/*", "other/experiments/x")
    assert wildcard_match("s3:Put*", "s3:PutObject")
    assert not wildcard_match("a[b]", "ab")  # no character classes in IAM


def test_actions_ignore_case_and_not_action_inverts() -> None:
    assert evaluate([identity(allow(Action="S3:putobject"))], put()) is Decision.ALLOW
    statement = {"Effect": "Allow", "NotAction": "s3:Delete*", "Resource": "*"}
    assert evaluate([identity(statement)], put()) is Decision.ALLOW
    assert evaluate([identity(statement)], Request("s3:DeleteObject", BUCKET_OBJECTS, ROLE)) is Decision.IMPLICIT_DENY


def test_not_resource() -> None:
    statement = {"Effect": "Deny", "Action": "*", "NotResource": "arn:aws:s3:::b/experiments/*"}
    assert evaluate([identity(allow(), statement)], put()) is Decision.ALLOW
    assert evaluate([identity(allow(), statement)], put("other/x")) is Decision.EXPLICIT_DENY


def test_arn_operators_match_segment_by_segment() -> None:
    assert arn_match(
        "arn:aws:cloudwatch:*:111122223333:alarm:beacon-demo-*",
        "arn:aws:cloudwatch:us-east-1:111122223333:alarm:beacon-demo-x",
    )
    assert not arn_match("arn:aws:events:*:111122223333:rule/*", "arn:aws:events:us-east-1:444455556666:rule/x")
    assert not arn_match("arn:aws:sqs:*", "arn:aws:sqs:us-east-1:1:q")  # too few segments


@pytest.mark.parametrize(
    ("condition", "context", "holds"),
    [
        ({"StringEquals": {"k": "v"}}, {"k": "v"}, True),
        ({"StringEquals": {"k": "v"}}, {"K": "v"}, True),  # key names ignore case
        ({"StringEquals": {"k": "v"}}, {"k": "V"}, False),
        ({"StringEquals": {"k": "v"}}, {}, False),  # positive operator, missing key
        ({"StringNotEquals": {"k": "v"}}, {}, True),  # negated operator, missing key
        ({"StringNotEquals": {"k": ["a", "b"]}}, {"k": "b"}, False),
        ({"StringNotEquals": {"k": ["a", "b"]}}, {"k": "c"}, True),
        ({"StringLike": {"k": "a*"}}, {"k": "abc"}, True),
        ({"StringEqualsIfExists": {"k": "v"}}, {}, True),
        ({"StringEqualsIfExists": {"k": "v"}}, {"k": "w"}, False),
        ({"Bool": {"aws:SecureTransport": "false"}}, {"aws:SecureTransport": True}, False),
        ({"Bool": {"aws:SecureTransport": "false"}}, {"aws:SecureTransport": False}, True),
        ({"Bool": {"aws:SecureTransport": "false"}}, {}, False),
        ({"Null": {"k": "true"}}, {}, True),
        ({"Null": {"k": "false"}}, {}, False),
        ({"NumericLessThan": {"n": "10"}}, {"n": 3}, True),
        ({"NumericGreaterThanEquals": {"n": "10"}}, {"n": 3}, False),
        (
            {"ArnLike": {"aws:SourceArn": "arn:aws:events:us-east-1:1:rule/a*"}},
            {"aws:SourceArn": "arn:aws:events:us-east-1:1:rule/ab"},
            True,
        ),
        ({"ForAllValues:StringEquals": {"k": ["a", "b"]}}, {"k": ["a"]}, True),
        ({"ForAllValues:StringEquals": {"k": ["a", "b"]}}, {"k": ["a", "c"]}, False),
        ({"ForAllValues:StringEquals": {"k": ["a"]}}, {}, True),  # vacuously true
        ({"ForAnyValue:StringEquals": {"k": ["a"]}}, {"k": ["c", "a"]}, True),
        ({"ForAnyValue:StringEquals": {"k": ["a"]}}, {}, False),
        ({"StringEquals": {"a": "1"}, "StringLike": {"b": "2*"}}, {"a": "1", "b": "3"}, False),  # AND
    ],
)
def test_condition_operators(condition: dict[str, Any], context: dict[str, Any], holds: bool) -> None:
    decision = evaluate([identity(allow(Condition=condition))], put(**context))
    assert (decision is Decision.ALLOW) is holds


def test_unknown_operator_is_an_error_not_a_guess() -> None:
    with pytest.raises(PolicyEvalError):
        evaluate([identity(allow(Condition={"DateLessThanish": {"k": "v"}}))], put(k="v"))


def test_principals() -> None:
    by_role = resource(allow(Principal={"AWS": ROLE}))
    assert evaluate([by_role], put()) is Decision.ALLOW
    assert evaluate([by_role], put(principal=OTHER_ACCOUNT_ROLE)) is Decision.IMPLICIT_DENY
    by_service = resource(allow(Principal={"Service": ["cloudwatch.amazonaws.com"]}))
    assert evaluate([by_service], put(principal="cloudwatch.amazonaws.com")) is Decision.ALLOW
    assert evaluate([by_service], put(principal="events.amazonaws.com")) is Decision.IMPLICIT_DENY
    anyone = resource(allow(Principal="*"))
    assert evaluate([anyone], put(principal=None)) is Decision.ALLOW
    assert evaluate([resource(allow(Principal={"AWS": "*"}))], put(principal=None)) is Decision.ALLOW
    assert evaluate([by_role], put(principal=None)) is Decision.IMPLICIT_DENY


def test_account_principal_delegates_to_identity_policies() -> None:
    by_account = resource(allow(Principal={"AWS": ROOT}))
    assert evaluate([by_account], put()) is Decision.IMPLICIT_DENY
    assert evaluate([by_account, identity(allow())], put()) is Decision.ALLOW
    assert evaluate([by_account], put(principal=None)) is Decision.IMPLICIT_DENY  # anonymous is no one's
    # A Deny naming the account reaches every principal in it.
    assert evaluate([identity(allow()), resource(deny(Principal={"AWS": ROOT}))], put()) is Decision.EXPLICIT_DENY


def test_not_principal() -> None:
    statement = deny(NotPrincipal={"AWS": ROLE})
    assert evaluate([identity(allow()), resource(statement)], put()) is Decision.ALLOW
    assert (
        evaluate([identity(allow()), resource(statement)], put(principal=OTHER_ACCOUNT_ROLE)) is Decision.EXPLICIT_DENY
    )


def test_key_policy_must_take_part() -> None:
    use_key = Request("kms:Decrypt", "arn:aws:kms:us-east-1:111122223333:key/k", ROLE)
    grant = identity({"Effect": "Allow", "Action": "kms:Decrypt", "Resource": "*"})
    assert evaluate([grant, key()], use_key) is Decision.IMPLICIT_DENY  # no root statement
    root = key({"Effect": "Allow", "Action": "kms:*", "Principal": {"AWS": ROOT}, "Resource": "*"})
    assert evaluate([grant, root], use_key) is Decision.ALLOW
    assert evaluate([root], use_key) is Decision.IMPLICIT_DENY


def test_a_role_is_taken_only_if_its_trust_policy_allows_the_caller_an_identity_allow_is_not_enough() -> None:
    """STS asks the role's trust policy: naming the caller suffices; naming its account delegates to the caller's
    own policy, which must allow too; and an identity policy allowing sts:AssumeRole on * alone takes no role."""
    role = "arn:aws:iam::111122223333:role/reader"
    take = Request("sts:AssumeRole", role, ROLE, {})
    anywhere = identity({"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": "*"})

    def trust(principal: str) -> PolicyDoc:
        statement = {"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"AWS": principal}}
        return PolicyDoc.of(PolicyKind.TRUST, {"Statement": [statement]})

    assert evaluate([trust(ROLE)], take) is Decision.ALLOW
    assert evaluate([trust(ROOT)], take) is Decision.IMPLICIT_DENY
    assert evaluate([trust(ROOT), anywhere], take) is Decision.ALLOW
    assert evaluate([trust("arn:aws:iam::111122223333:role/someone-else"), anywhere], take) is Decision.IMPLICIT_DENY


def test_principal_arn_is_the_callers_role_and_absent_for_a_service_or_anonymous() -> None:
    """AWS sets aws:PrincipalArn on every request of an IAM principal; a negated operator on it is then
    false for the named role, and true for a service principal or anonymous caller (the key is missing)."""
    fence = resource(deny(Principal="*", Condition={"ArnNotEquals": {"aws:PrincipalArn": [ROLE]}}))
    assert evaluate([identity(allow()), fence], put()) is Decision.ALLOW
    assert evaluate([identity(allow()), fence], put(principal=OTHER_ACCOUNT_ROLE)) is Decision.EXPLICIT_DENY
    for caller in ("sagemaker.amazonaws.com", None):
        assert evaluate([resource(allow(Principal="*")), fence], put(principal=caller)) is Decision.EXPLICIT_DENY
    # A context that names it itself wins (what a test states, it states).
    stated = Request("s3:PutObject", BUCKET_OBJECTS, OTHER_ACCOUNT_ROLE, {"aws:PrincipalArn": ROLE})
    assert evaluate([identity(allow()), fence], stated) is Decision.ALLOW


def test_managed_policies_are_read_from_their_vendored_text_or_refused() -> None:
    from tests.support import aws_managed_policies

    pull_only = aws_managed_policies.text("AmazonEC2ContainerRegistryPullOnly")
    assert pull_only is not None
    pull = Request("ecr:BatchGetImage", "arn:aws:ecr:us-east-1:111122223333:repository/r", ROLE)
    assert evaluate([PolicyDoc.of(PolicyKind.IDENTITY, pull_only)], pull) is Decision.ALLOW
    push = Request("ecr:PutImage", "arn:aws:ecr:us-east-1:111122223333:repository/r", ROLE)
    assert evaluate([PolicyDoc.of(PolicyKind.IDENTITY, pull_only)], push) is Decision.IMPLICIT_DENY
    # Known only by its services: it cannot bear on ECR, and would have to be read for EC2.
    assert aws_managed_policies.irrelevant("AmazonEKS_CNI_Policy", "ecr:BatchGetImage")
    assert not aws_managed_policies.irrelevant("AmazonEKS_CNI_Policy", "ec2:CreateNetworkInterface")
    assert not aws_managed_policies.irrelevant("SomethingUnknown", "ecr:BatchGetImage")
