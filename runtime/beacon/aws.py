"""boto3 clients from the standard SDK chain (AWS_REGION, AWS_ENDPOINT_URL, Pod Identity, ...),
with bounded standard retries, and a count of every request this process sends."""

from __future__ import annotations

import threading
from typing import Any

import boto3
from botocore.config import Config


class RequestCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_service: dict[str, int] = {}

    def __call__(self, request: Any = None, event_name: str = "", **_: Any) -> None:
        service = event_name.split(".")[1] if "." in event_name else "unknown"
        with self._lock:
            self.by_service[service] = self.by_service.get(service, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.by_service.values())


REQUESTS = RequestCounter()


def client(
    service: str, region: str, *, attempts: int = 4, connect_timeout: float = 5, read_timeout: float = 20
) -> Any:
    config = Config(
        region_name=region,
        retries={"mode": "standard", "max_attempts": attempts},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        user_agent_extra="beacon-job",
    )
    made = boto3.session.Session().client(service, config=config)
    made.meta.events.register("before-send", REQUESTS)
    return made
