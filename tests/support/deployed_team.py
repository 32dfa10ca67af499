"""The demo team "deployed" into moto, as `beacon smoke` and `beacon run` find it after `cdk deploy`.

moto provides CloudFormation (stand-in stacks carrying the synthesized templates' output keys), EKS's
describe, S3, CloudWatch, SSM, STS, IAM (enforced) and SageMaker's create/describe. What no machine
here can run is faked: the Kubernetes API (tests/support/fake_kubernetes.py) and SageMaker's training
instances (tests/support/sagemaker_standin.py). In both, the job that runs is the real job, as a local
process, writing as the writer role. The fixtures (`eks_api`, `deployed`, `kubernetes`, `sagemaker`)
are registered in tests/conftest.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from beacon import contract

from beacon_ops.local.provision import OPERATOR, Provisioned, provision_team
from config import names
from stacks.outputs import OPERATOR_NEEDS as STACK_OUTPUTS
from tests.support import local_tls
from tests.support.fake_kubernetes import FakeKubernetes
from tests.support.fault_proxy import FaultPlan, FaultProxy
from tests.support.moto_server import ACCOUNT, REGION, MotoServer
from tests.support.sagemaker_standin import SageMakerStandIn
from tests.support.strict_s3 import BucketPolicyGate
from tests.support.synth import ROOT, Synthesized
from workloads import manifests

TEAM = "demo"
BUCKET = "beacon-demo-smoke"
IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{names.smoke_image_repository(TEAM)}:0123abcd"  # cdk deploy's


CROSS_STACK_OUTPUTS = ("PublishOutput", "ExportsOutput")


def kebab(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", camel).lower()


def stand_in_outputs(demo: Synthesized, provisioned: Provisioned) -> dict[str, dict[str, str]]:
    """A value for every output the synthesized stacks declare, as a deploy would have produced."""
    store, monitoring = provisioned.store, provisioned.monitoring
    known = {
        "BucketName": store.bucket,
        "WriterRoleArn": store.writer_role_arn,
        "ReaderRoleArn": store.reader_role_arn,
        "KmsKeyArn": store.key_arn,
        "FileSystemId": "fs-0123456789abcdef0",
        "AccessPointId": "fsap-0123456789abcdef0",
        "ImageRepositoryUri": f"123456789012.dkr.ecr.us-east-1.amazonaws.com/{TEAM}-images",
        "ClusterName": names.cluster_name(TEAM),
        "TrainingNamespace": contract.TRAINING_NAMESPACE,
        "SmokeJobName": "beacon-smoke-deployed",
        "SmokeImageUri": IMAGE,
        "InterruptionQueueName": "beacon-demo-interruptions",
        "AlarmTopicArn": monitoring.topic_arn,
        "RunAlarmTemplateParameter": monitoring.run_alarm_parameter,
        "DashboardName": "beacon-demo",
    }
    stacks: dict[str, dict[str, str]] = {}
    for component in STACK_OUTPUTS:
        declared = demo.templates[names.stack_name(TEAM, component)].body.get("Outputs", {})
        values = {}
        for key in declared:
            if key.startswith(CROSS_STACK_OUTPUTS):
                continue  # what CDK wires between stacks, not what a team reads
            if key.endswith("AlarmName"):
                name = contract.team_alarm_name(TEAM, contract.TeamAlarm(kebab(key.removesuffix("AlarmName"))))
                assert name in monitoring.team_alarm_names
                values[key] = name
            else:
                assert key in known, f"the stand-in does not know output {key} of the {component} stack"
                values[key] = known[key]
        stacks[component] = values
    return stacks


@dataclass
class DeployedTeam:
    """The demo team 'deployed' into moto: its resources, its stacks' outputs, an operator who may
    do anything (who runs `cdk deploy`), and the writer's credentials (what Pod Identity would give)."""

    aws: MotoServer
    provisioned: Provisioned
    outputs: dict[str, dict[str, str]]
    writer: dict[str, str]
    eks_url: str

    @property
    def operator(self) -> dict[str, str]:
        return self.provisioned.operator_keys

    def client(self, service: str) -> Any:
        return self.aws.client(service, **self.operator)

    def env(self, extra_env: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BEACON_"))}
        env.update(
            AWS_ENDPOINT_URL=self.aws.url,
            AWS_ENDPOINT_URL_EKS=self.eks_url,
            AWS_REGION=REGION,
            AWS_ACCESS_KEY_ID=self.operator["aws_access_key_id"],
            AWS_SECRET_ACCESS_KEY=self.operator["aws_secret_access_key"],
            **(extra_env or {}),
        )
        return env

    def command(self, *args: str, verb: str = "smoke") -> list[str]:
        return [sys.executable, "-m", "beacon_ops.cli", verb, "--team", TEAM, *args]

    def cli(
        self, *args: str, extra_env: dict[str, str] | None = None, timeout: float = 420, verb: str = "smoke"
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*args, verb=verb),
            cwd=ROOT,
            env=self.env(extra_env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def deploy_stand_in(demo: Synthesized, aws: MotoServer, eks_api: MotoServer, *, stacks: bool = True) -> DeployedTeam:
    provisioned = provision_team(
        demo.templates, TEAM, clients=aws.client, account=ACCOUNT, region=REGION, bucket=BUCKET
    )
    aws.client("iam").put_user_policy(
        UserName=OPERATOR,
        PolicyName="deploys-beacon",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        ),
    )
    outputs = stand_in_outputs(demo, provisioned)
    if stacks:
        for component, values in outputs.items():
            aws.client("cloudformation").create_stack(
                StackName=names.stack_name(TEAM, component),
                TemplateBody=json.dumps(
                    {
                        "Resources": {"StandIn": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
                        "Outputs": {k: {"Value": v} for k, v in values.items()},
                    }
                ),
            )
    aws.enforce_iam()
    writer = provisioned.writer_credentials(aws.client("sts", **provisioned.operator_keys))
    return DeployedTeam(aws, provisioned, outputs, writer, eks_api.url)


def fake_cluster(
    deployed: DeployedTeam, workdir: Path, pod_credentials: dict[str, str] | None = None
) -> FakeKubernetes:
    creds = pod_credentials or deployed.writer
    pod_env = {
        "AWS_ENDPOINT_URL": deployed.aws.url,
        "AWS_ACCESS_KEY_ID": creds["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": creds["aws_secret_access_key"],
        **({"AWS_SESSION_TOKEN": creds["aws_session_token"]} if "aws_session_token" in creds else {}),
    }
    return FakeKubernetes(
        workdir,
        cluster_name=names.cluster_name(TEAM),
        access_key_id=deployed.operator["aws_access_key_id"],
        pod_environment=pod_env,
        namespaces={
            contract.TRAINING_NAMESPACE: {
                "serviceaccounts": [manifests.TRAINING_SERVICE_ACCOUNT],
                "persistentvolumeclaims": [manifests.ARTIFACTS_CLAIM],
            }
        },
    ).start()


@pytest.fixture(scope="session")
def eks_api() -> Iterator[MotoServer]:
    """moto cannot check SigV4 on EKS's REST paths once IAM is enforced (SignatureDoesNotMatch on
    every call), so the cluster's describe comes from a second moto, in its own process, unenforced."""
    server = MotoServer.start_process()
    server.client("eks").create_cluster(
        name=names.cluster_name(TEAM),
        roleArn=f"arn:aws:iam::{ACCOUNT}:role/beacon-demo-cluster",
        resourcesVpcConfig={"subnetIds": []},
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def deployed(demo: Synthesized, moto_server: MotoServer, eks_api: MotoServer) -> DeployedTeam:
    return deploy_stand_in(demo, moto_server, eks_api)


@pytest.fixture
def kubernetes(deployed: DeployedTeam, tmp_path: Path) -> Iterator[FakeKubernetes]:
    fake = fake_cluster(deployed, tmp_path / "cluster")
    yield fake
    fake.stop()


@pytest.fixture
def sagemaker(demo: Synthesized, deployed: DeployedTeam, tmp_path: Path) -> Iterator[SageMakerStandIn]:
    """SageMaker's instances, and SageMaker's own calls as the execution role through an endpoint as strict as
    AWS (https; the deployed bucket policy's conditions apply to its output upload)."""
    sts = deployed.aws.client("sts", **deployed.operator)
    strict = FaultProxy(deployed.aws.url, FaultPlan(), gate=BucketPolicyGate.of(demo.templates, TEAM, BUCKET), tls=True)
    strict.start()
    standin = SageMakerStandIn(
        upstream=deployed.aws.url,
        workdir=tmp_path / "sagemaker",
        role_credentials=lambda arn: Provisioned.role_credentials(sts, arn, "sagemaker-standin"),
        endpoint_for_job=deployed.aws.url,
        service_endpoint=strict.url,
        ca_bundle=str(local_tls.authority().ca_file),
    ).start()
    yield standin
    standin.stop()
    strict.stop()
