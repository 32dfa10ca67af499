"""The embedded AWS: a moto server on loopback, with the one API Beacon needs that moto lacks."""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import boto3
import requests
from moto.cloudwatch.exceptions import CloudWatchException, InvalidParameterCombination, InvalidParameterValue
from moto.cloudwatch.models import CloudWatchBackend
from moto.cloudwatch.responses import CloudWatchResponse
from moto.core.responses import ActionResult, BaseResponse
from moto.server import ThreadedMotoServer

from beacon_ops.local.processes import stop_process

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


# What CloudWatch refuses and moto accepts: one such datum fails the whole PutMetricData request.
METRIC_DATA_PER_REQUEST = 1000
# "Each PutMetricData request is limited to 1 MB in size for HTTP POST requests" (the API reference,
# which also allows a gzip'd payload: the size is what is sent). Beyond it CloudWatch answers 413
# RequestEntityTooLarge, "Request size N exceeded L bytes", whatever the data.
PUT_METRIC_DATA_BYTES = 1024 * 1024
VALUES_PER_DATUM = 150
DIMENSIONS_PER_DATUM = 30
VALUE_LIMIT = 2.0**360


def _refused_value(value: Any) -> bool:
    number = float(value)
    return not math.isfinite(number) or abs(number) > VALUE_LIMIT


def strict_metric_data(metric_data: list[dict[str, Any]]) -> None:
    """Raise what CloudWatch raises for a request it refuses (moto only refuses a NaN `Value`)."""
    if len(metric_data) > METRIC_DATA_PER_REQUEST:
        raise InvalidParameterValue(
            f"The collection MetricData must not have a size greater than {METRIC_DATA_PER_REQUEST}."
        )
    for number, datum in enumerate(metric_data, start=1):
        where = f"MetricData.member.{number}"
        if len(datum.get("Dimensions") or []) > DIMENSIONS_PER_DATUM:
            raise InvalidParameterValue(f"The collection {where}.Dimensions must not exceed {DIMENSIONS_PER_DATUM}.")
        if "Value" in datum and _refused_value(datum["Value"]):
            raise InvalidParameterValue(f"The value {datum['Value']} for parameter {where}.Value is invalid.")
        values = datum.get("Values") or []
        if len(values) > VALUES_PER_DATUM or any(_refused_value(v) for v in values):
            raise InvalidParameterValue(f"The parameter {where}.Values is invalid.")
        for statistic, value in (datum.get("StatisticValues") or {}).items():
            if _refused_value(value):
                raise InvalidParameterValue(
                    f"The value {value} for parameter {where}.StatisticValues.{statistic} is invalid."
                )


# GetMetricStatistics: "The maximum number of data points returned from a single call is 1,440. If you request more
# than 1,440 data points, CloudWatch returns an error." A high-resolution period is 1, 5, 10, 20 or 30 s; any other a
# multiple of 60 (the API reference). moto answers either with whatever it has. Written out here again, apart from
# the readers' own (`evidence.reading.finest_period`): the harness states AWS's rule, so a reader's slip fails it.
DATAPOINTS_PER_REQUEST = 1440
HIGH_RESOLUTION_PERIODS = (1, 5, 10, 20, 30)


def strict_statistics_request(start: datetime, end: datetime, period: int) -> None:
    if period not in HIGH_RESOLUTION_PERIODS and (period <= 0 or period % 60):
        raise InvalidParameterValue("The parameter Period must be 1, 5, 10, 20, 30, or a multiple of 60.")
    requested = math.ceil((end - start).total_seconds() / period)
    if requested > DATAPOINTS_PER_REQUEST:
        raise InvalidParameterCombination(
            f"You have requested up to {requested} datapoints, which exceeds the limit of {DATAPOINTS_PER_REQUEST}. "
            "You may reduce the datapoints requested by increasing Period, or decreasing the time range."
        )


class RequestEntityTooLarge(CloudWatchException):
    code = "RequestEntityTooLarge"


def request_size(response: BaseResponse) -> int:
    """The body's size as it came over the wire (moto has decompressed a gzip'd one by now)."""
    declared = response.headers.get("Content-Length")
    return int(declared) if declared else len(response.raw_body or b"")


def add_aws_strictness() -> None:
    """Refuse in moto what AWS refuses, so a test cannot pass on a request AWS would reject."""
    if getattr(CloudWatchBackend.put_metric_data, "beacon_strict", False):
        return
    lenient = CloudWatchBackend.put_metric_data
    lenient_request = CloudWatchResponse.put_metric_data

    def put_metric_data(self: CloudWatchBackend, namespace: str, metric_data: list[dict[str, Any]]) -> None:
        strict_metric_data(metric_data)
        lenient(self, namespace, metric_data)

    def put_metric_data_request(self: CloudWatchResponse) -> Any:
        size = request_size(self)
        if size <= PUT_METRIC_DATA_BYTES:
            return lenient_request(self)
        refused = RequestEntityTooLarge(f"Request size {size} exceeded {PUT_METRIC_DATA_BYTES} bytes")
        with warnings.catch_warnings():  # a refusal before the API: no error shape of CloudWatch's names it
            warnings.simplefilter("ignore", UserWarning)
            _, headers, body = self.serialized(ActionResult(refused))
        return body, {**headers, "status": 413}

    lenient_statistics = CloudWatchBackend.get_metric_statistics

    def get_metric_statistics(
        self: CloudWatchBackend, namespace: str, metric_name: str, start_time: datetime, end_time: datetime,
        period: int, *rest: Any, **more: Any,
    ) -> Any:  # fmt: skip
        strict_statistics_request(start_time, end_time, int(period))
        return lenient_statistics(self, namespace, metric_name, start_time, end_time, period, *rest, **more)

    put_metric_data.beacon_strict = True  # type: ignore[attr-defined]
    CloudWatchBackend.put_metric_data = put_metric_data  # type: ignore[method-assign]
    CloudWatchBackend.get_metric_statistics = get_metric_statistics  # type: ignore[method-assign]
    CloudWatchResponse.put_metric_data = put_metric_data_request  # type: ignore[method-assign]


@dataclass
class EmbeddedAws:
    url: str
    _stop: Callable[[], None]
    pid: int = 0  # its own process's, when it has one (`start_process`)

    @classmethod
    def start(cls) -> EmbeddedAws:
        """In this process: cheap to start, but it shares the GIL with whatever else runs here."""
        add_missing_apis()
        add_aws_strictness()
        quiet_request_log()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        return cls(f"http://{host}:{port}", server.stop)

    @classmethod
    def start_process(cls, timeout: float = 60) -> EmbeddedAws:
        """In a process of its own, so a training loop measured beside it keeps its GIL."""
        process = subprocess.Popen(
            [sys.executable, "-m", "beacon_ops.local.moto"], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        assert process.stdout is not None
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline and not line.startswith(READY):
            line = process.stdout.readline()
            if not line and process.poll() is not None:
                raise RuntimeError(f"embedded AWS exited with {process.returncode} before it was ready")

        def stop() -> None:
            stop_process(process)

        if not line.startswith(READY):
            stop()
            raise RuntimeError("embedded AWS did not start in time")
        return cls(line.removeprefix(READY).strip(), stop, process.pid)

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
    """`python -m beacon_ops.local.moto`: serve on a free loopback port until SIGTERM."""
    aws = EmbeddedAws.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print(f"{READY}{aws.url}", flush=True)
    # Nothing more to say, and one kept running (`beacon local --keep`) must not hold its starter's output open:
    # whoever reads that (a pipeline, a test) would wait for it to end
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.dup2(devnull, sys.stderr.fileno())
    done.wait()
    aws.stop()


if __name__ == "__main__":
    serve()
