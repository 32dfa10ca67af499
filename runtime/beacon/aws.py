"""boto3 clients from the standard SDK chain (AWS_REGION, AWS_ENDPOINT_URL, Pod Identity, ...),
with bounded standard retries, and a count of every request this process sends."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import CredentialRetrievalError

log = logging.getLogger("beacon.aws")

# On a node that just started, the Pod Identity agent (a DaemonSet) may start after the training pod: its
# credentials endpoint refuses until then, and a preflight that gave up would exit 3, final for the Job's
# podFailurePolicy. A client waits this long for the endpoint to answer.
CONTAINER_CREDENTIALS_WAIT_S = 90.0
CONTAINER_CREDENTIALS = "AWS_CONTAINER_CREDENTIALS_FULL_URI"  # what EKS Pod Identity (and ECS) set


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
    service: str,
    region: str,
    *,
    attempts: int = 4,
    connect_timeout: float = 5,
    read_timeout: float = 20,
    wait_s: float = CONTAINER_CREDENTIALS_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Any:
    config = Config(
        region_name=region,
        retries={"mode": "standard", "max_attempts": attempts},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        user_agent_extra="beacon-job",
    )
    started, said = clock(), False
    while True:
        try:
            made = boto3.session.Session().client(service, config=config)
            break
        except CredentialRetrievalError as error:  # credentials are fetched when the client is made
            if not os.environ.get(CONTAINER_CREDENTIALS) or clock() - started >= wait_s:
                raise
            if not said:
                log.warning("no credentials yet from %s (%s); waiting up to %.0f s for the Pod Identity agent",
                            os.environ[CONTAINER_CREDENTIALS], error, wait_s)  # fmt: skip
                said = True
            sleep(1.0)
    made.meta.events.register("before-send", REQUESTS)
    return made
