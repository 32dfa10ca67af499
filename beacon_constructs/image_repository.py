"""A team's image repository: where its training images live, and the only roles that may pull or push them.

Who may pull: the Karpenter node role (on EKS the kubelet pulls with the node's role, never the pod's),
through its own ``AmazonEC2ContainerRegistryPullOnly`` (``ecr:BatchGetImage`` and
``ecr:GetDownloadUrlForLayer`` on ``*``): within one account an identity policy alone suffices, so the
repository grants it nothing. And SageMaker, which pulls a training image as the job's execution role
(the writer): it gets a pull grant on this repository alone.

That managed policy lets *every* node role of the account pull *every* repository of the account, another
team's included. So the repository policy denies pulling and pushing to any principal but the roles named
here (``aws:PrincipalArn``, which for a role session is the role's ARN). The fence denies nothing else:
describing, scanning, lifecycle and the repository policy itself stay with the account's administrators,
so no one is locked out.

Who may push: the roles named in ``push_role_arns`` (a CI pipeline, an operator, the CDK bootstrap's image
publishing role for Beacon's own smoke image), allowed by this policy, which also lets them describe the
repository and its images (what `cdk deploy` asks before it pushes an asset); they still need
``ecr:GetAuthorizationToken`` (no resource type) from their own policy.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from beacon_constructs.nag import acknowledge
from beacon_constructs.tagging import tag_component

PULL_ACTIONS = ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer")
PUSH_ACTIONS = ("ecr:InitiateLayerUpload", "ecr:UploadLayerPart", "ecr:CompleteLayerUpload", "ecr:PutImage")
# Which layers the registry already holds: a pusher asks before uploading, SageMaker's pull asks too.
LAYER_CHECK_ACTION = "ecr:BatchCheckLayerAvailability"
LOGIN_ACTION = "ecr:GetAuthorizationToken"  # no resource type: `docker login` for the whole registry
# What a pusher reads first: `cdk deploy` finds the repository's URI, and skips an image already there.
DESCRIBE_ACTIONS = ("ecr:DescribeRepositories", "ecr:DescribeImages")
FENCED_ACTIONS = PULL_ACTIONS + PUSH_ACTIONS


class ImageRepository(Construct):
    """An encrypted repository with immutable tags, scanned on push, whose untagged images expire.

    - ``pull_roles``: roles granted pull here, by an identity policy on this repository (SageMaker's
      execution role).
    - ``node_role_arns``: roles whose own policy already allows pulling (a node role's
      ``AmazonEC2ContainerRegistryPullOnly``); the repository only admits them. ARNs, not roles: the
      node role lives in a stack deployed after this one.
    - ``push_role_arns``: roles that push (and may pull); they must exist when the policy is set.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        encryption_key: kms.IKey,
        untagged_image_expiry: Duration,
        pull_roles: Sequence[iam.IRole] = (),
        node_role_arns: Sequence[str] = (),
        push_role_arns: Sequence[str] = (),
        repository_name: str | None = None,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, construct_id)
        tag_component(self, "image-repository")
        self.admitted_role_arns = [*node_role_arns, *(r.role_arn for r in pull_roles), *push_role_arns]
        if not self.admitted_role_arns:
            raise ValueError("an image repository no role may pull from would be useless: name at least one")

        self.repository = ecr.Repository(
            self,
            "Repository",
            repository_name=repository_name,
            image_scan_on_push=True,
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,  # a tag names one image forever
            encryption=ecr.RepositoryEncryption.KMS,
            encryption_key=encryption_key,
            # A repository that goes with its stack goes with its images (Beacon's smoke image: rebuilt by deploy)
            empty_on_delete=removal_policy is RemovalPolicy.DESTROY,
            lifecycle_rules=[
                ecr.LifecycleRule(
                    rule_priority=1,
                    description=f"expire untagged images after {untagged_image_expiry.to_days()} days",
                    tag_status=ecr.TagStatus.UNTAGGED,
                    max_image_age=untagged_image_expiry,
                )
            ],
            removal_policy=removal_policy,
        )
        self.repository.add_to_resource_policy(
            iam.PolicyStatement(
                sid="OnlyTheseRolesPullOrPush",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=list(FENCED_ACTIONS),
                conditions={"ArnNotEquals": {"aws:PrincipalArn": self.admitted_role_arns}},
            )
        )
        if push_role_arns:
            self.repository.add_to_resource_policy(
                iam.PolicyStatement(
                    sid="PushersPushAndPull",
                    principals=[iam.ArnPrincipal(arn) for arn in push_role_arns],
                    actions=[*PUSH_ACTIONS, *PULL_ACTIONS, LAYER_CHECK_ACTION, *DESCRIBE_ACTIONS],
                )
            )

        self.pull_policy: iam.Policy | None = None
        if pull_roles:
            self.pull_policy = iam.Policy(
                self,
                "PullPolicy",
                roles=list(pull_roles),
                statements=[
                    iam.PolicyStatement(
                        sid="PullImages",
                        actions=[*PULL_ACTIONS, LAYER_CHECK_ACTION],
                        resources=[self.repository.repository_arn],
                    ),
                    iam.PolicyStatement(sid="RegistryLogin", actions=[LOGIN_ACTION], resources=["*"]),
                ],
            )
            acknowledge(
                self.pull_policy,
                "IAM5[Resource::*]",
                "ecr:GetAuthorizationToken has no resource type; pulling is granted on this repository alone.",
            )
