from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from config import TeamConfig, load_team
from tests.moto_server import MotoServer
from tests.synth import Synthesized, synthesize

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")


@pytest.fixture(scope="session")
def demo_config() -> TeamConfig:
    return load_team("demo")


@pytest.fixture(scope="session")
def demo(demo_config: TeamConfig, tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """The demo team's whole app, synthesized once per test session."""
    return synthesize(demo_config, tmp_path_factory.mktemp("cdk.out"))


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
