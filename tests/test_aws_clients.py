"""`beacon.aws`: clients from the SDK chain. On a node that just started, the Pod Identity agent may start after the
training pod (issue 25, item 9): a client waits for its credentials endpoint rather than fail the preflight (exit 3,
final for the Job's podFailurePolicy). Against a real local endpoint that starts answering a few seconds late."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from beacon import aws
from botocore.exceptions import CredentialRetrievalError


class Agent(BaseHTTPRequestHandler):
    """What the Pod Identity agent answers at its credentials endpoint."""

    def log_message(self, *_: object) -> None: ...

    def do_GET(self) -> None:
        body = json.dumps({"AccessKeyId": "ASIAEXAMPLE", "SecretAccessKey": "secret", "Token": "token",
                           "Expiration": "2099-01-01T00:00:00Z"}).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def late_agent(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[float]:
    """An agent endpoint on loopback that refuses connections for a few seconds (botocore itself retries for about
    3 s), then answers; the SDK sees nothing else."""
    delay = float(getattr(request, "param", 5.0))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"http://127.0.0.1:{port}/v1/credentials")
    monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", "token")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    servers: list[HTTPServer] = []
    done = threading.Event()

    def start_late() -> None:
        if done.wait(delay):
            return  # the test ended first
        server = HTTPServer(("127.0.0.1", port), Agent)
        servers.append(server)
        server.serve_forever()

    threading.Thread(target=start_late, daemon=True).start()
    yield delay
    done.set()
    for server in servers:
        server.shutdown()


def test_a_client_waits_for_a_pod_identity_agent_that_starts_after_the_pod(late_agent: float) -> None:
    started = time.monotonic()
    client = aws.client("s3", "us-east-1")
    credentials = client._request_signer._credentials.get_frozen_credentials()
    assert credentials.access_key == "ASIAEXAMPLE"
    assert time.monotonic() - started >= late_agent, "it waited for the agent"


@pytest.mark.parametrize("late_agent", [20.0], indirect=True)
def test_the_wait_is_bounded(late_agent: float) -> None:
    with pytest.raises(CredentialRetrievalError):
        aws.client("s3", "us-east-1", wait_s=0)
