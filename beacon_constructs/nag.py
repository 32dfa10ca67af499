"""cdk-nag acknowledgements: one exact finding at a time, each with its reason."""

from aws_cdk import Acknowledgment, Stack, Token, Validations
from constructs import IConstruct

PACK = "AwsSolutions"


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """Acknowledge one finding, e.g. ``IAM5[Resource::*]``, on ``scope`` and below."""
    Validations.of(scope).acknowledge(Acknowledgment(id=f"{PACK}::{PACK}-{finding}", reason=reason))


def nag_arn(stack: Stack, service: str, resource: str, name: str, *, separator: str = ":") -> str:
    """An ARN as cdk-nag names it in a finding: pseudo parameters when env-agnostic, literals otherwise."""
    partition, region, account = (
        f"<AWS::{pseudo}>" if Token.is_unresolved(value) else value
        for pseudo, value in (("Partition", stack.partition), ("Region", stack.region), ("AccountId", stack.account))
    )
    return f"arn:{partition}:{service}:{region}:{account}:{resource}{separator}{name}"
