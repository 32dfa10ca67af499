"""Open the operator's AWS session the same way in every command, or say in one line what is missing.

Region order, everywhere: the command's --region flag, then the team file's region, then the
environment (AWS_REGION, AWS_DEFAULT_REGION, the profile's region).
"""

from __future__ import annotations

import os
from typing import Any

import boto3
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    ProfileNotFound,
    SSOError,
    TokenRetrievalError,
)

LOGIN_HINT = (
    "run `aws sso login --profile <name>` and set AWS_PROFILE=<name>, "
    "or export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
)


class AccessError(Exception):
    """AWS access is missing or unusable; the message is one line naming what and how to fix it."""


def resolve_region(*, flag: str | None, team_region: str | None) -> str | None:
    """The region a command uses: flag > team file > environment (None: let the profile decide)."""
    return flag or team_region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def open_session(*, region_flag: str | None, team_region: str | None) -> boto3.session.Session:
    """A session with credentials and a region, or AccessError; no AWS call is made."""
    try:
        session = boto3.session.Session(region_name=resolve_region(flag=region_flag, team_region=team_region))
    except ProfileNotFound:
        profile = os.environ.get("AWS_PROFILE", "")
        raise AccessError(
            f"AWS_PROFILE={profile!r} is not a profile in ~/.aws/config; see `aws configure list-profiles`, "
            "or `aws configure sso` to add it"
        ) from None
    try:
        credentials = session.get_credentials()
    except (NoCredentialsError, BotoCoreError) as error:
        raise AccessError(f"AWS credentials could not be loaded ({error}); {LOGIN_HINT}") from None
    if credentials is None:
        raise AccessError(f"no AWS credentials found; {LOGIN_HINT}")
    if session.region_name is None:
        raise AccessError("no AWS region: pass --region, or set AWS_REGION")
    return session


# Error codes AWS answers when the credentials themselves are the problem.
REJECTED_CREDENTIALS = frozenset(
    {
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
    }
)


def describe_aws_error(error: ClientError | BotoCoreError) -> str:
    """One line: missing or rejected credentials get the way to fix them; anything else AWS's answer."""
    if isinstance(error, NoCredentialsError | SSOError | TokenRetrievalError):
        return f"AWS credentials are missing or expired ({error}); {LOGIN_HINT}"
    if isinstance(error, ClientError) and error.response.get("Error", {}).get("Code") in REJECTED_CREDENTIALS:
        return f"AWS rejected the credentials ({error.response['Error']['Code']}); {LOGIN_HINT}"
    text = " ".join(str(error).split())
    return f"AWS refused a call: {text}" if isinstance(error, ClientError) else f"AWS could not be reached: {text}"


def describe_stack(cloudformation: Any, stack: str) -> tuple[str, dict[str, str]]:
    """A stack's status and outputs: the one reader of stack outputs (its keys: stacks/outputs.py)."""
    answer = cloudformation.describe_stacks(StackName=stack)["Stacks"][0]
    return str(answer.get("StackStatus", "")), {o["OutputKey"]: o["OutputValue"] for o in answer.get("Outputs", [])}


def deployed_stack_outputs(cloudformation: Any, stack: str, region: str, team: str) -> dict[str, str]:
    """A deployed stack's outputs, or AccessError saying in one line that it is missing or broken, and how
    to deploy it."""
    try:
        status, outputs = describe_stack(cloudformation, stack)
    except ClientError as error:
        if "does not exist" in str(error):
            raise AccessError(
                f"stack {stack} not found in {region}: deploy it first (make deploy TEAM={team})"
            ) from None
        raise AccessError(f"stack {stack}: cannot describe it: {describe_aws_error(error)}") from None
    # An update rolled back leaves the stack as it was before, usable; a failed create's rollback does not
    if not status.endswith("_COMPLETE") or status in ("ROLLBACK_COMPLETE", "DELETE_COMPLETE"):
        raise AccessError(f"stack {stack} is {status}, not deployed cleanly: fix and redeploy it first")
    return outputs
