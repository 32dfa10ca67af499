"""The embedded AWS: a moto server on loopback, with the one API Beacon needs that moto lacks."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
import requests
from moto.cloudwatch.responses import CloudWatchResponse
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
ADMIN = {"aws_access_key_id": "admin", "aws_secret_access_key": "admin"}
READY = "beacon-embedded-aws ready at "


def quiet_request_log() -> None:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)


def add_missing_apis() -> None:
    """moto stores composite alarms through put_metric_alarm (it reads AlarmRule) but has no
    PutCompositeAlarm handler; route that action to it. moto never evaluates either kind."""
    if not hasattr(CloudWatchResponse, "put_composite_alarm"):
        CloudWatchResponse.put_composite_alarm = CloudWatchResponse.put_metric_alarm  # type: ignore[attr-defined]


@dataclass
class EmbeddedAws:
    url: str
    _stop: Callable[[], None]

    @classmethod
    def start(cls) -> EmbeddedAws:
        """In this process: cheap to start, but it shares the GIL with whatever else runs here."""
        add_missing_apis()
        quiet_request_log()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        return cls(f"http://{host}:{port}", server.stop)

    @classmethod
    def start_process(cls, timeout: float = 60) -> EmbeddedAws:
        """In a process of its own, so a training loop measured beside it keeps its GIL."""
        process = subprocess.Popen(
            [sys.executable, "-m", "beacon.embedded_aws"], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        assert process.stdout is not None
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline and not line.startswith(READY):
            line = process.stdout.readline()
            if not line and process.poll() is not None:
                raise RuntimeError(f"embedded AWS exited with {process.returncode} before it was ready")

        def stop() -> None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

        if not line.startswith(READY):
            stop()
            raise RuntimeError("embedded AWS did not start in time")
        return cls(line.removeprefix(READY).strip(), stop)

    def stop(self) -> None:
        self._stop()

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

    def user_without_rights(self, name: str) -> dict[str, str]:
        """Credentials of a fresh IAM user with no policy at all; enforcement stays on."""
        self.reset_auth_only()
        try:
            iam = self.client("iam")
            iam.create_user(UserName=name)
            keys = iam.create_access_key(UserName=name)["AccessKey"]
        finally:
            self.enforce_iam()
        return {"aws_access_key_id": keys["AccessKeyId"], "aws_secret_access_key": keys["SecretAccessKey"]}

    def reset(self) -> None:
        """moto's state is process-wide: switch enforcement off and forget every resource."""
        self._reset_auth(b"inf")
        requests.post(f"{self.url}/moto-api/reset", timeout=10).raise_for_status()


def serve() -> None:
    """`python -m beacon.embedded_aws`: serve on a free loopback port until SIGTERM."""
    aws = EmbeddedAws.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print(f"{READY}{aws.url}", flush=True)
    done.wait()
    aws.stop()


if __name__ == "__main__":
    serve()
