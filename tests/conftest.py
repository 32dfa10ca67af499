from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from beacon_ops.local.sandbox import Sandbox, provision_sandbox
from bench.mlflow_server import MlflowServer
from config import TeamConfig, load_team
from config.model import TEAMS_DIR, parse_team
from tests.support.deployed_team import deployed, eks_api, kubernetes, sagemaker  # noqa: F401 (fixtures)
from tests.support.fault_proxy import FaultPlan, FaultProxy
from tests.support.moto_server import MotoServer
from tests.support.policy_eval import ACCOUNT as POLICY_ACCOUNT
from tests.support.strict_s3 import BucketPolicyGate
from tests.support.synth import Synthesized, synthesize

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")


@pytest.fixture(scope="session")
def demo_config() -> TeamConfig:
    return load_team("demo")


@pytest.fixture(scope="session")
def demo(demo_config: TeamConfig, tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """The demo team's whole app, synthesized once per test session."""
    return synthesize(demo_config, tmp_path_factory.mktemp("cdk.out"))


# A real team's file: an account and a region (so CDK would look AZs up), the lean profile, and
# two kinds of alarm destination. It is synthesized once, offline, with cdk-nag enforced.
ACCOUNT_TEAM: dict[str, object] = {
    "team": "vision",
    "account": "123456789012",
    "region": "eu-west-1",
    "profile": "lean",
    "cluster": {"bastion": True},
    "monitoring": {
        "alarm_email": ["ml-oncall@example.com", "ml-lead@example.com"],
        "alarm_topic_arns": ["arn:aws:sns:eu-west-1:123456789012:ml-chat"],
    },
}


@pytest.fixture(scope="session")
def account_team(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """A team with an account and region (lean profile), synthesized once per test session."""
    config = parse_team(ACCOUNT_TEAM, TEAMS_DIR / "vision.toml")
    return synthesize(config, tmp_path_factory.mktemp("cdk.out.vision"))


VISION_OPERATOR = f"arn:aws:iam::{POLICY_ACCOUNT}:role/vision-platform"
VISION_READER = f"arn:aws:iam::{POLICY_ACCOUNT}:role/vision-ml-engineers"


@pytest.fixture(scope="session")
def vision(demo_config: TeamConfig, tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """A second team, "vision", in the account the policy evaluator resolves the demo team into:
    the cross-team isolation tests need two teams side by side."""
    values = demo_config.model_dump()
    values["monitoring"]["alarm_email"] = ["oncall@vision.example.com"]  # a team with an account notifies someone
    values["cluster"]["operator_role_arns"] = [VISION_OPERATOR]  # its readers by name (demo names none)
    values["artifacts"]["reader_role_arns"] = [VISION_READER]
    config = TeamConfig.model_validate({**values, "team": "vision", "account": POLICY_ACCOUNT})
    return synthesize(config, tmp_path_factory.mktemp("cdk.out.vision"))


@pytest.fixture(scope="session")
def _moto_process_server() -> Iterator[MotoServer]:
    server = MotoServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def moto_server(_moto_process_server: MotoServer) -> Iterator[MotoServer]:
    """A real moto server, empty and with IAM enforcement off at the start of each test."""
    _moto_process_server.reset()
    yield _moto_process_server
    _moto_process_server.reset()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """A real `mlflow server` on 127.0.0.1 (SQLite store), one per test session."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


# The demo team provisioned in moto from its templates, IAM enforced, acting as the writer: the same
# sandbox `beacon local` opens (beacon_ops.local.sandbox), on the session's moto server.
WriterSession = Sandbox


@pytest.fixture
def as_writer(demo: Synthesized, moto_server: MotoServer, tmp_path: Path) -> WriterSession:
    return provision_sandbox(moto_server, demo.templates, "demo", bucket="beacon-demo-test", workdir=tmp_path)


@pytest.fixture
def strict_s3(demo: Synthesized, as_writer: WriterSession) -> BucketPolicyGate:
    """The demo team's synthesized bucket policy, applied to the test bucket as S3 would apply it."""
    return BucketPolicyGate.of(demo.templates, "demo", as_writer.bucket)


@pytest.fixture
def strict_aws(as_writer: WriterSession, strict_s3: BucketPolicyGate) -> Iterator[str]:
    """An endpoint as strict as AWS: https, and moto behind the bucket policy's conditions. Jobs talk to this."""
    proxy = FaultProxy(as_writer.aws.url, FaultPlan(), gate=strict_s3, tls=True).start()
    try:
        yield proxy.url
    finally:
        proxy.stop()


# The longest single test (mypy over the whole project: about 5 minutes from a cold cache, as on a fresh clone)
# goes first, so it runs beside the rest on its worker, not alone after them (`make test` uses --dist loadfile).
FIRST = "tests/test_lint.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] != FIRST)
