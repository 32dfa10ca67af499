"""Temporary credentials of an assumed role, in the keyword form boto3 clients take."""

from __future__ import annotations

from typing import Any


def assume_role_credentials(sts: Any, role_arn: str, session_name: str) -> dict[str, str]:
    creds = sts.assume_role(RoleArn=role_arn, RoleSessionName=session_name)["Credentials"]
    return {
        "aws_access_key_id": creds["AccessKeyId"],
        "aws_secret_access_key": creds["SecretAccessKey"],
        "aws_session_token": creds["SessionToken"],
    }
