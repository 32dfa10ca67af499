"""cdk-nag acknowledgements: one exact finding at a time, each with its reason."""

from aws_cdk import Acknowledgment, Validations
from constructs import IConstruct

PACK = "AwsSolutions"


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """Acknowledge one finding, e.g. ``IAM5[Resource::*]``, on ``scope`` and below."""
    Validations.of(scope).acknowledge(Acknowledgment(id=f"{PACK}::{PACK}-{finding}", reason=reason))
