"""The embedded AWS: a moto server on loopback, with the one API Beacon needs that moto lacks."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import boto3
import requests
from moto.cloudwatch.responses import CloudWatchResponse
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
ADMIN = {"aws_access_key_id": "admin", "aws_secret_access_key": "admin"}


def quiet_request_log() -> None:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)


def add_missing_apis() -> None:
    """moto stores composite alarms through put_metric_alarm (it reads AlarmRule) but has no
    PutCompositeAlarm handler; route that action to it. moto never evaluates either kind."""
    if not hasattr(CloudWatchResponse, "put_composite_alarm"):
        CloudWatchResponse.put_composite_alarm = CloudWatchResponse.put_metric_alarm  # type: ignore[attr-defined]


@dataclass
class EmbeddedAws:
    server: ThreadedMotoServer
    url: str

    @classmethod
    def start(cls) -> EmbeddedAws:
        add_missing_apis()
        quiet_request_log()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        return cls(server, f"http://{host}:{port}")

    def stop(self) -> None:
        self.server.stop()

    def client(self, service: str, **credentials: str) -> Any:
        return boto3.client(service, endpoint_url=self.url, region_name=REGION, **(credentials or ADMIN))

    def _reset_auth(self, budget: bytes) -> None:
        requests.post(f"{self.url}/moto-api/reset-auth", data=budget, timeout=10).raise_for_status()

    def enforce_iam(self) -> None:
        """From now on every request needs credentials that IAM in moto allows."""
        self._reset_auth(b"0")

    def reset_auth_only(self) -> None:
        """Switch IAM enforcement off, keeping every resource (to inspect as the admin)."""
        self._reset_auth(b"inf")

    def reset(self) -> None:
        """moto's state is process-wide: switch enforcement off and forget every resource."""
        self._reset_auth(b"inf")
        requests.post(f"{self.url}/moto-api/reset", timeout=10).raise_for_status()
