"""The image repository construct on its own, in a bare stack (issue 14, item 1).

Its template shape is asserted with Match/Capture; whether AWS would let a role pull or push is asked
of the policy evaluator (tests/support/policy_eval.py) over the same template. The whole app's answer,
for two teams in one account and the real node role, is in test_policies_as_aws_evaluates.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk import App, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk.assertions import Capture, Match, Template

from beacon_constructs.image_repository import FENCED_ACTIONS, PULL_ACTIONS, PUSH_ACTIONS, ImageRepository
from beacon_ops.templates import Template as SynthesizedTemplate
from tests.support.policy_eval import ACCOUNT, Decision, Deployment, PolicyDoc, PolicyKind, Request, explain

NODE_ROLE = f"arn:aws:iam::{ACCOUNT}:role/KarpenterNodeRole-beacon-demo"
PUSHER = f"arn:aws:iam::{ACCOUNT}:role/ml-ci"
OTHER_NODE_ROLE = f"arn:aws:iam::{ACCOUNT}:role/KarpenterNodeRole-beacon-vision"
# What an account's other roles typically carry: every node role has this, a CI role often more.
PULL_ANYWHERE = {"Effect": "Allow", "Action": ["ecr:GetAuthorizationToken", *PULL_ACTIONS], "Resource": "*"}
PUSH_ANYWHERE = {"Effect": "Allow", "Action": ["ecr:*"], "Resource": "*"}


def bare_stack(**overrides: Any) -> Stack:
    stack = Stack(App(), "Images")
    key = kms.Key(stack, "Key")
    execution_role = iam.Role(stack, "ExecutionRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    settings: dict[str, Any] = {
        "encryption_key": key,
        "untagged_image_expiry": Duration.days(14),
        "pull_roles": [execution_role],
        "node_role_arns": [NODE_ROLE],
        "push_role_arns": [PUSHER],
        **overrides,
    }
    ImageRepository(stack, "Images", **settings)
    return stack


@pytest.fixture(scope="module")
def template() -> Template:
    return Template.from_stack(bare_stack())


def repository_policy(template: Template) -> list[dict[str, Any]]:
    (repository,) = template.find_resources("AWS::ECR::Repository").values()
    return list(repository["Properties"]["RepositoryPolicyText"]["Statement"])


def test_retained_kms_encrypted_immutable_and_scanned_on_push(template: Template) -> None:
    key = Capture()
    template.has_resource(
        "AWS::ECR::Repository",
        {
            "Properties": {
                "EncryptionConfiguration": {"EncryptionType": "KMS", "KmsKey": {"Fn::GetAtt": [key, "Arn"]}},
                "ImageTagMutability": "IMMUTABLE",
                "ImageScanningConfiguration": {"ScanOnPush": True},
            },
            "DeletionPolicy": "Retain",
            "UpdateReplacePolicy": "Retain",
        },
    )
    assert key.as_string().startswith("Key")  # the key handed in, not an AWS-owned one


def test_untagged_images_expire_after_the_configured_days_and_nothing_else_does(template: Template) -> None:
    text = Capture()
    template.has_resource_properties("AWS::ECR::Repository", {"LifecyclePolicy": {"LifecyclePolicyText": text}})
    (rule,) = json.loads(text.as_string())["rules"]
    assert rule["selection"] == {
        "tagStatus": "untagged",
        "countType": "sinceImagePushed",
        "countNumber": 14,
        "countUnit": "days",
    }
    assert rule["action"] == {"type": "expire"}


def test_the_fence_denies_pull_and_push_to_every_principal_but_the_named_roles(template: Template) -> None:
    (fence,) = [s for s in repository_policy(template) if s["Sid"] == "OnlyTheseRolesPullOrPush"]
    assert fence["Effect"] == "Deny" and fence["Principal"] == {"AWS": "*"}
    assert sorted(fence["Action"]) == sorted(FENCED_ACTIONS)
    admitted = fence["Condition"]["ArnNotEquals"]["aws:PrincipalArn"]
    assert admitted[0] == NODE_ROLE and admitted[2] == PUSHER
    execution_role_id, attribute = admitted[1]["Fn::GetAtt"]
    assert execution_role_id.startswith("ExecutionRole") and attribute == "Arn"
    # Nothing an administrator needs is fenced: no one is locked out of the repository itself.
    assert not {"ecr:SetRepositoryPolicy", "ecr:DeleteRepository", "ecr:DescribeImages"} & set(fence["Action"])


def test_only_the_pushers_get_an_allow_in_the_repository_policy(template: Template) -> None:
    allows = [s for s in repository_policy(template) if s["Effect"] == "Allow"]
    assert [s["Principal"] for s in allows] == [{"AWS": PUSHER}]
    assert set(PUSH_ACTIONS) <= set(allows[0]["Action"])
    without_pushers = Template.from_stack(bare_stack(push_role_arns=[]))
    assert [s["Effect"] for s in repository_policy(without_pushers)] == ["Deny"]


def test_the_execution_role_may_pull_this_repository_only_and_push_nothing(template: Template) -> None:
    template.has_resource_properties(
        "AWS::IAM::Policy",
        {
            "Roles": [{"Ref": Match.string_like_regexp("ExecutionRole")}],
            "PolicyDocument": {
                "Statement": [
                    {
                        "Sid": "PullImages",
                        "Effect": "Allow",
                        "Action": [*PULL_ACTIONS, "ecr:BatchCheckLayerAvailability"],
                        "Resource": {"Fn::GetAtt": [Match.string_like_regexp("ImagesRepository"), "Arn"]},
                    },
                    {"Sid": "RegistryLogin", "Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
                ]
            },
        },
    )


def test_a_repository_no_one_may_use_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        bare_stack(pull_roles=[], node_role_arns=[], push_role_arns=[])


def test_removal_policy_is_retain_unless_told() -> None:
    template = Template.from_stack(bare_stack(removal_policy=RemovalPolicy.DESTROY))
    template.has_resource("AWS::ECR::Repository", {"DeletionPolicy": "Delete"})


# --- would AWS allow it? ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def aws(template: Template) -> Deployment:
    return Deployment({"images": SynthesizedTemplate("images", dict(template.to_json()))})


def repository_arn(aws: Deployment) -> str:
    return aws.arn("images", aws.find("images", "AWS::ECR::Repository"))


def execution_role(aws: Deployment) -> str:
    return aws.arn("images", aws.find("images", "AWS::IAM::Role", "ExecutionRole"))


def decide(aws: Deployment, action: str, principal: str, *identity: dict[str, Any]) -> Decision:
    """As AWS decides: the repository's policy, the role's policies in the template, and `identity`
    (what a role outside the template carries)."""
    request = Request(action, repository_arn(aws), principal)
    extra = [PolicyDoc.of(PolicyKind.IDENTITY, {"Statement": list(identity)}, "given")] if identity else []
    return explain(aws.policies_for(request) + extra, request).decision


@pytest.mark.parametrize("action", PULL_ACTIONS)
def test_the_node_role_and_the_execution_role_may_pull(aws: Deployment, action: str) -> None:
    assert decide(aws, action, NODE_ROLE, PULL_ANYWHERE) is Decision.ALLOW
    assert decide(aws, action, execution_role(aws)) is Decision.ALLOW


@pytest.mark.parametrize("action", FENCED_ACTIONS)
def test_another_teams_node_role_is_refused_even_with_pull_rights_on_every_repository(
    aws: Deployment, action: str
) -> None:
    assert decide(aws, action, OTHER_NODE_ROLE, PULL_ANYWHERE, PUSH_ANYWHERE) is Decision.EXPLICIT_DENY


@pytest.mark.parametrize("action", PUSH_ACTIONS)
def test_only_the_pusher_may_push(aws: Deployment, action: str) -> None:
    assert decide(aws, action, PUSHER) is Decision.ALLOW  # the repository's own Allow suffices
    assert decide(aws, action, execution_role(aws)) is Decision.IMPLICIT_DENY
    assert decide(aws, action, NODE_ROLE, PULL_ANYWHERE) is Decision.IMPLICIT_DENY
