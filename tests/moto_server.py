"""A real moto server on loopback, for tests where AWS behaviour matters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import boto3
import requests
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account


@dataclass
class MotoServer:
    server: ThreadedMotoServer
    url: str

    @classmethod
    def start(cls) -> MotoServer:
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        return cls(server, f"http://{host}:{port}")

    def stop(self) -> None:
        self.server.stop()

    def client(self, service: str, **credentials: str) -> Any:
        credentials = credentials or {"aws_access_key_id": "admin", "aws_secret_access_key": "admin"}
        return boto3.client(service, endpoint_url=self.url, region_name=REGION, **credentials)

    def reset(self) -> None:
        """moto's state is process-wide: switch enforcement off and forget every resource."""
        requests.post(f"{self.url}/moto-api/reset-auth", data=b"inf", timeout=10).raise_for_status()
        requests.post(f"{self.url}/moto-api/reset", timeout=10).raise_for_status()

    def enforce_iam(self) -> None:
        """From now on every request needs credentials that IAM in moto allows."""
        requests.post(f"{self.url}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()
