"""Would AWS allow it? IAM policy evaluation on synthesized templates.

moto ignores every condition in identity policies and matches trust principals literally, so a moto
pass proves actions and resources only. This module answers "may principal P do action A on
resource R with request context C" the way AWS documents its evaluation logic:

- an explicit Deny in any applicable statement wins;
- otherwise an Allow decides: from an identity policy of the principal, or from a resource policy
  that names the principal itself (or ``*``); a resource policy that names only the principal's
  account delegates to identity policies, and a KMS key policy must always take part;
- otherwise the request is implicitly denied.

Conditions: the String, Arn, Bool, Numeric and Null operators, their ``IfExists`` forms and the
``ForAnyValue:``/``ForAllValues:`` set qualifiers. A negated operator on a key the request lacks is
true; a positive one is false. ``*`` and ``?`` wildcards match across ``/`` (and, in Resource and
String operators, across ``:``); Arn operators match each ARN segment on its own.

Context: ``aws:PrincipalArn`` is the caller's ARN when it is an IAM principal (AWS sets it on every such
request) unless the request states it; every other key is what the request states. AWS managed policies
attached to a role are read from their vendored text (tests/support/aws_managed_policies.py), or raise.

No library on PyPI evaluates conditions (policyuniverse parses and expands, parliament lints,
policy_sentry writes policies), so this is written here. Templates are resolved with
``beacon.templates.Resolver`` against a fake account and region.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from typing import Any

from beacon_ops.templates import Resolver, Template, TemplateError
from tests.support import aws_managed_policies

ACCOUNT = "111122223333"
REGION = "us-east-1"
PARTITION = "aws"

ContextValue = str | bool | int | float | Sequence[str]


class Decision(StrEnum):
    ALLOW = "allow"
    EXPLICIT_DENY = "explicit deny"
    IMPLICIT_DENY = "implicit deny"


class PolicyKind(StrEnum):
    IDENTITY = "identity"  # attached to the principal: no Principal element
    RESOURCE = "resource"  # bucket, topic, queue, file system or trust policy: Principal decides
    KEY = "key"  # a KMS key policy: a resource policy that must take part in every decision
    # A role's trust policy, likewise: an identity policy alone never lets anyone take a role (STS asks the trust
    # policy, which allows a principal itself, or its account: then the principal's own policy must allow too).
    TRUST = "trust"


@dataclass(frozen=True)
class PolicyDoc:
    kind: PolicyKind
    statements: tuple[Mapping[str, Any], ...]
    source: str = ""  # where it came from, for failure messages

    @classmethod
    def of(cls, kind: PolicyKind, document: Mapping[str, Any], source: str = "") -> PolicyDoc:
        statements = document["Statement"]
        return cls(kind, tuple(statements if isinstance(statements, list) else [statements]), source)


@dataclass(frozen=True)
class Request:
    """One API request. ``principal`` is an IAM ARN (a role, user or account root), a service
    principal such as ``cloudwatch.amazonaws.com``, or None for an anonymous caller."""

    action: str
    resource: str
    principal: str | None
    context: Mapping[str, object] = field(default_factory=dict)  # each a ContextValue

    def value(self, key: str) -> list[str] | None:
        if key.lower() == "aws:principalarn" and not any(k.lower() == "aws:principalarn" for k in self.context):
            # AWS sets it on every request an IAM principal makes (a role session: the role's ARN).
            return [self.principal] if self.principal and ":iam::" in self.principal else None
        for name, value in self.context.items():
            if name.lower() == key.lower():
                if isinstance(value, bool):
                    return [str(value).lower()]
                if isinstance(value, str | int | float):
                    return [str(value)]
                if isinstance(value, list | tuple):
                    return [str(v) for v in value]
                raise PolicyEvalError(f"context value of {name} is not a ContextValue: {value!r}")
        return None


class PolicyEvalError(Exception):
    """A policy uses something this evaluator does not model; never guess."""


# --- matching ---------------------------------------------------------------------------------
@cache
def _glob(pattern: str, *, ignore_case: bool) -> re.Pattern[str]:
    # Not fnmatch: it would read [...] as a class; IAM knows only * and ?.
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(f"^{body}$", re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def wildcard_match(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    return bool(_glob(pattern, ignore_case=ignore_case).match(value))


def arn_match(pattern: str, arn: str) -> bool:
    """ArnLike/ArnEquals: the six segments are matched one by one, wildcards within a segment."""
    pattern_parts, arn_parts = pattern.split(":", 5), arn.split(":", 5)
    if len(pattern_parts) != 6 or len(arn_parts) != 6:
        return False
    return all(wildcard_match(p, a) for p, a in zip(pattern_parts, arn_parts, strict=True))


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _account_of(principal: str) -> str | None:
    parts = principal.split(":")
    return parts[4] if principal.startswith("arn:") and len(parts) > 4 and parts[4] else None


class PrincipalMatch(StrEnum):
    NONE = "none"
    DIRECT = "direct"  # the principal itself, a service principal, or "*"
    ACCOUNT = "account"  # only the principal's account: delegates to identity policies


def principal_match(statement: Mapping[str, Any], principal: str | None) -> PrincipalMatch:
    if "NotPrincipal" in statement:
        matched = _principal_block_match(statement["NotPrincipal"], principal)
        return PrincipalMatch.NONE if matched is not PrincipalMatch.NONE else PrincipalMatch.DIRECT
    if "Principal" not in statement:
        raise PolicyEvalError(f"resource-policy statement without Principal: {statement}")
    return _principal_block_match(statement["Principal"], principal)


def _principal_block_match(block: Any, principal: str | None) -> PrincipalMatch:
    if block == "*":
        return PrincipalMatch.DIRECT
    best = PrincipalMatch.NONE
    for kind, values in block.items():
        for value in _as_list(values):
            if kind == "AWS" and value == "*":
                return PrincipalMatch.DIRECT
            if principal is None:
                continue
            if kind == "Service" and value == principal:
                return PrincipalMatch.DIRECT
            if kind == "AWS":
                if value == principal:
                    return PrincipalMatch.DIRECT
                account = value if re.fullmatch(r"\d{12}", value) else None
                if value.endswith(":root"):
                    account = _account_of(value)
                if account is not None and account == _account_of(principal):
                    best = PrincipalMatch.ACCOUNT
            elif kind not in ("Service", "Federated", "CanonicalUser"):
                raise PolicyEvalError(f"unknown principal kind {kind}")
    return best


def _action_match(statement: Mapping[str, Any], action: str) -> bool:
    if "Action" in statement:
        return any(wildcard_match(p, action, ignore_case=True) for p in _as_list(statement["Action"]))
    if "NotAction" in statement:
        return not any(wildcard_match(p, action, ignore_case=True) for p in _as_list(statement["NotAction"]))
    raise PolicyEvalError(f"statement without Action or NotAction: {statement}")


def _resource_match(statement: Mapping[str, Any], resource: str, kind: PolicyKind) -> bool:
    if "Resource" in statement:
        return any(wildcard_match(p, resource) for p in _as_list(statement["Resource"]))
    if "NotResource" in statement:
        return not any(wildcard_match(p, resource) for p in _as_list(statement["NotResource"]))
    if kind is PolicyKind.IDENTITY:
        raise PolicyEvalError(f"identity statement without Resource: {statement}")
    return True  # trust policies name no resource: the role itself


# --- conditions -------------------------------------------------------------------------------
def _string(policy: str, value: str) -> bool:
    return policy == value


def _number(compare: str) -> Any:
    op = {
        "Equals": operator.eq,
        "NotEquals": operator.eq,
        "LessThan": operator.lt,
        "LessThanEquals": operator.le,
        "GreaterThan": operator.gt,
        "GreaterThanEquals": operator.ge,
    }[compare]
    return lambda policy, value: op(float(value), float(policy))


_MATCHERS: dict[str, Any] = {
    "StringEquals": _string,
    "StringNotEquals": _string,
    "StringEqualsIgnoreCase": lambda p, v: p.lower() == v.lower(),
    "StringNotEqualsIgnoreCase": lambda p, v: p.lower() == v.lower(),
    "StringLike": lambda p, v: wildcard_match(p, v),
    "StringNotLike": lambda p, v: wildcard_match(p, v),
    "ArnEquals": arn_match,
    "ArnNotEquals": arn_match,
    "ArnLike": arn_match,
    "ArnNotLike": arn_match,
    "Bool": lambda p, v: p.lower() == v.lower(),
    **{f"Numeric{name}": _number(name) for name in ("Equals", "LessThan", "LessThanEquals", "GreaterThan")},
    "NumericNotEquals": _number("NotEquals"),
    "NumericGreaterThanEquals": _number("GreaterThanEquals"),
}
_NEGATED = {
    "StringNotEquals",
    "StringNotEqualsIgnoreCase",
    "StringNotLike",
    "ArnNotEquals",
    "ArnNotLike",
    "NumericNotEquals",
}


def condition_holds(operator: str, key: str, policy_values: Any, request: Request) -> bool:
    """One operator on one key, as AWS evaluates it."""
    qualifier, _, name = operator.rpartition(":")
    if qualifier not in ("", "ForAnyValue", "ForAllValues"):
        raise PolicyEvalError(f"unknown condition qualifier {qualifier}")
    if_exists = name.endswith("IfExists")
    name = name.removesuffix("IfExists")
    wanted = [str(v).lower() if isinstance(v, bool) else str(v) for v in _as_list(policy_values)]
    values = request.value(key)

    if name == "Null":
        return (values is None) == (wanted[0].lower() == "true")
    if name not in _MATCHERS:
        raise PolicyEvalError(f"unsupported condition operator {operator}")
    matcher, negated = _MATCHERS[name], name in _NEGATED

    def matches(value: str) -> bool:
        return any(matcher(policy, value) for policy in wanted)

    if qualifier == "ForAllValues":
        # Every request value must match; vacuously true for a missing or empty key.
        return all((not matches(v)) if negated else matches(v) for v in values or [])
    if values is None:
        return if_exists or (negated and qualifier == "")
    if qualifier == "ForAnyValue":
        return any((not matches(v)) if negated else matches(v) for v in values)
    if negated:
        return not any(matches(v) for v in values)
    return any(matches(v) for v in values)


def conditions_hold(statement: Mapping[str, Any], request: Request) -> bool:
    return all(
        condition_holds(operator, key, values, request)
        for operator, block in statement.get("Condition", {}).items()
        for key, values in block.items()
    )


# --- evaluation -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Explanation:
    decision: Decision
    deciding: tuple[str, ...]  # sources (and Sids) of the statements that decided


def _label(policy: PolicyDoc, statement: Mapping[str, Any]) -> str:
    return f"{policy.source}:{statement.get('Sid', '?')}"


def explain(policies: Iterable[PolicyDoc], request: Request) -> Explanation:
    """The decision and the statements behind it."""
    denies: list[str] = []
    identity_allows: list[str] = []
    direct_allows: list[str] = []
    account_allows: list[str] = []
    key_policy_present = False
    for policy in policies:
        key_policy_present |= policy.kind in (PolicyKind.KEY, PolicyKind.TRUST)
        for statement in policy.statements:
            if not (
                _action_match(statement, request.action) and _resource_match(statement, request.resource, policy.kind)
            ):
                continue
            reach = PrincipalMatch.DIRECT
            if policy.kind is not PolicyKind.IDENTITY:
                reach = principal_match(statement, request.principal)
                if reach is PrincipalMatch.NONE:
                    continue
            if not conditions_hold(statement, request):
                continue
            label = _label(policy, statement)
            if statement["Effect"] == "Deny":
                denies.append(label)
            elif policy.kind is PolicyKind.IDENTITY:
                identity_allows.append(label)
            elif reach is PrincipalMatch.DIRECT:
                direct_allows.append(label)
            else:
                account_allows.append(label)
    if denies:
        return Explanation(Decision.EXPLICIT_DENY, tuple(denies))
    if key_policy_present:
        # KMS and STS: the key or trust policy must allow, itself or by enabling IAM policies of its account.
        if direct_allows:
            return Explanation(Decision.ALLOW, tuple(direct_allows))
        if account_allows and identity_allows:
            return Explanation(Decision.ALLOW, tuple(account_allows + identity_allows))
        return Explanation(Decision.IMPLICIT_DENY, ())
    if identity_allows or direct_allows:
        return Explanation(Decision.ALLOW, tuple(identity_allows + direct_allows))
    return Explanation(Decision.IMPLICIT_DENY, ())


def evaluate(policies: Iterable[PolicyDoc], request: Request) -> Decision:
    return explain(policies, request).decision


def allowed(policies: Iterable[PolicyDoc], request: Request) -> bool:
    return evaluate(policies, request) is Decision.ALLOW


# --- templates --------------------------------------------------------------------------------
ARN_ATTRIBUTES = {
    "AWS::IAM::Role": lambda p, name: f"arn:{PARTITION}:iam::{ACCOUNT}:role/{name}",
    "AWS::S3::Bucket": lambda p, name: f"arn:{PARTITION}:s3:::{name}",
    "AWS::KMS::Key": lambda p, name: f"arn:{PARTITION}:kms:{REGION}:{ACCOUNT}:key/{name}",
    "AWS::SQS::Queue": lambda p, name: f"arn:{PARTITION}:sqs:{REGION}:{ACCOUNT}:{name}",
    "AWS::SNS::Topic": lambda p, name: f"arn:{PARTITION}:sns:{REGION}:{ACCOUNT}:{name}",
    "AWS::Events::Rule": lambda p, name: f"arn:{PARTITION}:events:{REGION}:{ACCOUNT}:rule/{name}",
    "AWS::EFS::FileSystem": lambda p, name: f"arn:{PARTITION}:elasticfilesystem:{REGION}:{ACCOUNT}:file-system/{name}",
    "AWS::EFS::AccessPoint": lambda p, name: (
        f"arn:{PARTITION}:elasticfilesystem:{REGION}:{ACCOUNT}:access-point/{name}"
    ),
    "AWS::SSM::Parameter": lambda p, name: f"arn:{PARTITION}:ssm:{REGION}:{ACCOUNT}:parameter{name}",
    "AWS::CloudWatch::Alarm": lambda p, name: f"arn:{PARTITION}:cloudwatch:{REGION}:{ACCOUNT}:alarm:{name}",
    "AWS::EKS::Cluster": lambda p, name: f"arn:{PARTITION}:eks:{REGION}:{ACCOUNT}:cluster/{name}",
    "AWS::ECR::Repository": lambda p, name: f"arn:{PARTITION}:ecr:{REGION}:{ACCOUNT}:repository/{name}",
    "AWS::Logs::LogGroup": lambda p, name: f"arn:{PARTITION}:logs:{REGION}:{ACCOUNT}:log-group:{name}:*",
}
NAME_PROPERTIES = {
    "AWS::IAM::Role": "RoleName",
    "AWS::S3::Bucket": "BucketName",
    "AWS::SQS::Queue": "QueueName",
    "AWS::SNS::Topic": "TopicName",
    "AWS::Events::Rule": "Name",
    "AWS::SSM::Parameter": "Name",
    "AWS::CloudWatch::Alarm": "AlarmName",
    "AWS::EKS::Cluster": "Name",
    "AWS::ECR::Repository": "RepositoryName",
    "AWS::Logs::LogGroup": "LogGroupName",
}
# Types whose Ref is the ARN rather than the name.
REF_IS_ARN = {"AWS::SNS::Topic"}


class Deployment:
    """A set of synthesized templates, resolved as if deployed into one fake account and region.

    Physical names come from the template where it sets them, otherwise from the logical id, so
    two teams synthesized apart resolve to distinct resources in the same account.
    """

    def __init__(self, templates: Mapping[str, Template]) -> None:
        self.templates = dict(templates)
        self._owner = {
            logical_id: name for name, template in self.templates.items() for logical_id in template.resources
        }
        self._exports: dict[str, Any] = {}
        for name, template in self.templates.items():
            for output_id, output in template.body.get("Outputs", {}).items():
                export = output.get("Export", {}).get("Name")
                if export is not None:
                    self._exports[str(export)] = (name, output["Value"])
                self._exports[f"{name}.{output_id}"] = (name, output["Value"])

    def resolver(self, stack: str) -> Resolver:
        template = self.templates[stack]

        def attributes(logical_id: str, attribute: str | None) -> str:
            return self._attribute(template, logical_id, attribute)

        def imports(name: str) -> str:
            if name not in self._exports:
                raise TemplateError(f"no export {name}")
            owner, value = self._exports[name]
            return str(self.resolver(owner).resolve(value))

        return Resolver(account=ACCOUNT, region=REGION, attributes=attributes, imports=imports)

    def resolve(self, stack: str, value: Any) -> Any:
        return self.resolver(stack).resolve(value)

    def physical_name(self, template: Template, logical_id: str) -> str:
        resource = template.resources[logical_id]
        prop = NAME_PROPERTIES.get(resource["Type"])
        if prop and prop in resource.get("Properties", {}):
            return str(self.resolve(template.name, resource["Properties"][prop]))
        return f"{template.name}-{logical_id}".lower()

    def _attribute(self, template: Template, logical_id: str, attribute: str | None) -> str:
        if logical_id not in template.resources:
            raise TemplateError(f"{template.name}: no resource {logical_id}")
        resource_type = template.resources[logical_id]["Type"]
        name = self.physical_name(template, logical_id)
        arn = ARN_ATTRIBUTES.get(resource_type)
        if attribute is None:
            if resource_type in REF_IS_ARN and arn:
                return arn(template.resources[logical_id], name)
            if resource_type == "AWS::SQS::Queue":
                return f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{name}"
            return name
        if attribute in ("Arn", "TopicArn") and arn:
            return arn(template.resources[logical_id], name)
        if attribute in ("TopicName", "QueueName", "Name"):
            return name
        if attribute in ("AccessPointId", "FileSystemId", "KeyId", "RoleId"):
            return name
        if attribute == "RepositoryUri":
            return f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{name}"
        raise TemplateError(f"{template.name}: cannot resolve {logical_id}.{attribute}")

    # --- what AWS would hold once deployed --------------------------------------------------
    def arn(self, stack: str, logical_id: str) -> str:
        return self._attribute(self.templates[stack], logical_id, "Arn")

    def find(self, stack: str, resource_type: str, logical_id_prefix: str = "") -> str:
        return self.templates[stack].one_of_type(resource_type, logical_id_prefix=logical_id_prefix)[0]

    def role_arn(self, stack: str, logical_id: str) -> str:
        return self.arn(stack, logical_id)

    def identity_policies(self, role_arn: str, action: str | None = None) -> list[PolicyDoc]:
        """Every AWS::IAM::Policy (in any stack) attached to the role, the role's inline policies, and the
        AWS managed policies it carries whose text is vendored (tests/support/aws_managed_policies.py).
        A managed policy known only by its services is left out for an ``action`` of another service;
        any other managed policy raises."""
        out: list[PolicyDoc] = []
        for name, template in self.templates.items():
            for logical_id, resource in template.resources.items():
                properties = resource.get("Properties", {})
                if resource["Type"] == "AWS::IAM::Policy":
                    roles = [self.resolve(name, r) for r in properties.get("Roles", [])]
                    role_names = {role_arn.rsplit("/", 1)[-1]}
                    if role_names & set(roles):
                        document = self.resolve(name, properties["PolicyDocument"])
                        out.append(PolicyDoc.of(PolicyKind.IDENTITY, document, f"{name}/{logical_id}"))
                elif resource["Type"] == "AWS::IAM::Role" and self.arn(name, logical_id) == role_arn:
                    for managed in self.resolve(name, properties.get("ManagedPolicyArns", [])):
                        policy = aws_managed_policies.policy_name(managed)
                        document = aws_managed_policies.text(policy)
                        if document is not None:
                            out.append(PolicyDoc.of(PolicyKind.IDENTITY, document, f"aws-managed/{policy}"))
                        elif action is None or not aws_managed_policies.irrelevant(policy, action):
                            raise PolicyEvalError(f"{name}/{logical_id} carries {policy}; its text is not here")
                    for inline in properties.get("Policies", []):
                        document = self.resolve(name, inline["PolicyDocument"])
                        out.append(PolicyDoc.of(PolicyKind.IDENTITY, document, f"{name}/{logical_id}"))
        return out

    def trust_policy(self, role_arn: str) -> PolicyDoc:
        for name, template in self.templates.items():
            for logical_id in template.of_type("AWS::IAM::Role"):
                if self.arn(name, logical_id) == role_arn:
                    document = self.resolve(
                        name, template.resources[logical_id]["Properties"]["AssumeRolePolicyDocument"]
                    )
                    return PolicyDoc.of(PolicyKind.TRUST, document, f"{name}/{logical_id}:trust")
        raise TemplateError(f"no role {role_arn}")

    def resource_policies(self, resource_arn: str) -> list[PolicyDoc]:
        """The resource policy of a bucket (for the bucket and its objects), topic, queue, key, file
        system, image repository or role (its trust policy), as AWS would attach it."""
        out: list[PolicyDoc] = []
        for name, template in self.templates.items():
            for logical_id, resource in template.resources.items():
                properties = resource.get("Properties", {})
                kind, document, targets = PolicyKind.RESOURCE, None, []
                if resource["Type"] == "AWS::S3::BucketPolicy":
                    bucket = self.resolve(name, properties["Bucket"])
                    targets, document = [f"arn:{PARTITION}:s3:::{bucket}"], properties["PolicyDocument"]
                elif resource["Type"] == "AWS::SNS::TopicPolicy":
                    targets, document = self.resolve(name, properties["Topics"]), properties["PolicyDocument"]
                elif resource["Type"] == "AWS::SQS::QueuePolicy":
                    urls = self.resolve(name, properties["Queues"])
                    targets = [f"arn:{PARTITION}:sqs:{REGION}:{ACCOUNT}:{u.rsplit('/', 1)[-1]}" for u in urls]
                    document = properties["PolicyDocument"]
                elif resource["Type"] == "AWS::KMS::Key":
                    kind, targets, document = PolicyKind.KEY, [self.arn(name, logical_id)], properties["KeyPolicy"]
                elif resource["Type"] == "AWS::IAM::Role":  # the trust policy is the role's resource policy
                    kind, targets = PolicyKind.TRUST, [self.arn(name, logical_id)]
                    document = properties["AssumeRolePolicyDocument"]
                elif resource["Type"] == "AWS::EFS::FileSystem" and "FileSystemPolicy" in properties:
                    targets, document = [self.arn(name, logical_id)], properties["FileSystemPolicy"]
                elif resource["Type"] == "AWS::ECR::Repository" and "RepositoryPolicyText" in properties:
                    targets, document = [self.arn(name, logical_id)], properties["RepositoryPolicyText"]
                if document is None:
                    continue
                if any(resource_arn == t or resource_arn.startswith(f"{t}/") for t in targets):
                    out.append(PolicyDoc.of(kind, self.resolve(name, document), f"{name}/{logical_id}"))
        return out

    def policies_for(self, request: Request) -> list[PolicyDoc]:
        """Everything AWS would weigh for this request: the principal's identity policies (for an
        IAM role) and the target's resource policy."""
        out = list(self.resource_policies(request.resource))
        if request.principal and ":role/" in request.principal:
            out += self.identity_policies(request.principal, request.action)
        return out

    def decide(self, request: Request, session_policy: Mapping[str, Any] | None = None) -> Explanation:
        """AWS's decision; with `session_policy`, for a session of the role taken with that policy (AssumeRole's
        `Policy`): what the role's policies allow must be allowed by the session policy too. No resource policy
        here names a session, so none grants past it."""
        explanation = explain(self.policies_for(request), request)
        if session_policy is None or explanation.decision is not Decision.ALLOW:
            return explanation
        session = explain([PolicyDoc.of(PolicyKind.IDENTITY, session_policy, "session policy")], request)
        if session.decision is Decision.ALLOW:
            return Explanation(Decision.ALLOW, explanation.deciding + session.deciding)
        return session


def merge(*deployments: Mapping[str, Template]) -> dict[str, Template]:
    out: dict[str, Template] = {}
    for templates in deployments:
        out.update(templates)
    return out


__all__ = [
    "ACCOUNT",
    "REGION",
    "Decision",
    "Deployment",
    "Explanation",
    "PolicyDoc",
    "PolicyEvalError",
    "PolicyKind",
    "Request",
    "allowed",
    "arn_match",
    "evaluate",
    "explain",
    "merge",
    "wildcard_match",
]
