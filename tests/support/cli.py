"""The `beacon` command as a user runs it: a real subprocess, against an embedded AWS endpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

from beacon_ops.local.provision import OPERATOR
from config import names
from tests.support.moto_server import REGION
from tests.support.synth import ROOT

if TYPE_CHECKING:
    from tests.conftest import WriterSession


def against(endpoint: str, **keys: str) -> dict[str, str]:
    """This environment without its AWS and Beacon settings, pointed at `endpoint` (any keys by default)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BEACON_"))}
    env.update(AWS_ENDPOINT_URL=endpoint, AWS_REGION=REGION, AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y")
    env.update(keys)
    return env


def beacon(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "beacon_ops.cli", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def operator_of_the_artifacts_stack(as_writer: WriterSession, team: str) -> dict[str, str]:
    """The team's artifacts stack as CloudFormation holds it (its outputs), and an operator that may read them: its
    keys. What `beacon tensorboard` and `beacon goodput` find before they take the reader role."""
    aws, store = as_writer.aws, as_writer.provisioned.store
    aws.reset_auth_only()
    try:
        aws.client("iam").put_user_policy(
            UserName=OPERATOR,
            PolicyName="read-beacon-stacks",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "cloudformation:DescribeStacks", "Resource": "*"}],
                }
            ),
        )
        aws.client("cloudformation").create_stack(
            StackName=names.stack_name(team, "artifacts"),
            TemplateBody=json.dumps(
                {
                    "Resources": {"StandIn": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
                    "Outputs": {
                        "BucketName": {"Value": store.bucket},
                        "ReaderRoleArn": {"Value": store.reader_role_arn},
                        "WriterRoleArn": {"Value": store.writer_role_arn},
                    },
                }
            ),
        )
    finally:
        aws.enforce_iam()
    return as_writer.provisioned.operator_keys
