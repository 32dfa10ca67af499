"""A small fault-injecting HTTP proxy between the job and moto: loopback only, bounded, stops itself.

It tells S3 from CloudWatch by the SigV4 credential scope, and on a configurable fraction of their
requests answers 500, throttles (503 SlowDown), resets the connection, or adds latency. It can also
stop forwarding for a stretch (the endpoint unreachable), or lose one PUT's answer: S3 takes the object and
the client sees a 500, and the reads of that key that follow are throttled (the retry's 412 cannot be compared).

Which requests are faulted is a schedule per service, not a coin toss over the interleaved stream:
the first eligible request of every service is faulted, then one in every 1/fraction, the position
inside each stride drawn at random (FaultPlan.seed). So a test that asserts a fault on CloudWatch gets one in
every run, however the threads happened to interleave.

A slow link delays and reorders rather than fails: an "overtaken" request is held until a request
that reached the proxy after it has been answered, then forwarded. The release is that event, not a
sleep; `hold_limit_s` only keeps a last request, which nothing follows, from waiting forever.

With `tls=True` the proxy speaks https (a certificate from tests/support/local_tls.py), as AWS does,
and the bucket-policy gate sees `aws:SecureTransport` as the request really arrived.
"""

from __future__ import annotations

import http.client
import random
import re
import socket
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

from tests.support.local_tls import authority
from tests.support.strict_s3 import BucketPolicyGate

SCOPE = re.compile(r"Credential=[^/]+/\d{8}/[^/]+/([^/]+)/aws4_request")
FAULTS = ("error_500", "slow_down_503", "reset", "latency")
OVERTAKEN = "overtaken"  # held until a later request was answered: a slow link, not a failure
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


@dataclass
class FaultPlan:
    fraction: float = 0.0
    services: tuple[str, ...] = ("s3", "monitoring")
    kinds: tuple[str, ...] = FAULTS
    latency_s: float = 0.3
    spare_first: int = 0  # requests forwarded untouched first (the job's preflight)
    fail_first: int = 0  # the first N requests of each service in `services` fail, kinds in turn
    seed: int = 7
    hold_limit_s: float = 10.0  # an overtaken request nothing follows is forwarded after this
    max_requests: int = 20_000
    max_lifetime_s: float = 600.0
    lose_answer_of: str = ""  # the first PUT whose path ends with this lands in S3, and its client sees a 500
    throttled_reads_after: int = 0  # then this many GETs of that path answer 503 SlowDown


class FaultSchedule:
    """Which of one service's eligible requests are faulted: the first, then one per stride."""

    def __init__(self, fraction: float, seed: str) -> None:
        self.stride = max(1, round(1 / fraction))
        self.random = random.Random(seed)
        self.offsets: list[int] = [0]  # stride 0 faults its first request: every run meets a fault

    def faults(self, index: int) -> bool:
        stride, position = divmod(index, self.stride)
        while len(self.offsets) <= stride:
            self.offsets.append(self.random.randrange(self.stride))
        return position == self.offsets[stride]


@dataclass
class FaultStats:
    forwarded: Counter[str] = field(default_factory=Counter)
    injected: Counter[str] = field(default_factory=Counter)
    refused_while_down: int = 0
    overtaken: Counter[str] = field(default_factory=Counter)  # held, and a later request answered first
    held_to_the_limit: Counter[str] = field(default_factory=Counter)  # held, and nothing came after it
    upstream_status: Counter[tuple[str, int]] = field(default_factory=Counter)  # what moto answered
    answers_lost: int = 0
    reads_throttled: int = 0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    tls: ssl.SSLContext | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        """The TLS handshake happens here, in the connection's own thread, never in the accept loop."""
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        try:
            secured = self.tls.wrap_socket(request, server_side=True)
        except OSError:  # a client that never finished its handshake
            return
        try:
            super().finish_request(secured, client_address)
        finally:
            self.shutdown_request(secured)


class FaultProxy:
    def __init__(
        self, upstream: str, plan: FaultPlan, *, gate: BucketPolicyGate | None = None, tls: bool = False
    ) -> None:
        self.upstream = urlparse(upstream)
        self.plan = plan
        self.gate = gate  # the bucket policy as S3 applies it (moto ignores its conditions)
        self.stats = FaultStats()
        self.lock = threading.Lock()
        self.requests = 0
        self.eligible: Counter[str] = Counter()
        self.turns: Counter[str] = Counter()
        self.schedules: dict[str, FaultSchedule] = {}
        self.failed_first: Counter[str] = Counter()
        self.down = threading.Event()
        self.down_services: tuple[str, ...] | None = None
        self.arrivals = 0  # requests numbered as they reach the proxy
        self.answered = threading.Condition(self.lock)
        self.last_answered_arrival = -1  # the highest arrival number answered so far
        self.started = time.monotonic()
        self.reads_to_throttle = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None: ...

            def do_GET(self) -> None:
                proxy.handle(self)

            do_PUT = do_POST = do_HEAD = do_DELETE = do_GET

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.tls = authority().server_context() if tls else None
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="fault-proxy")
        self.watchdog = threading.Timer(plan.max_lifetime_s, self.stop)
        self.watchdog.daemon = True

    def start(self) -> FaultProxy:
        self.thread.start()
        self.watchdog.start()
        return self

    def stop(self) -> None:
        self.watchdog.cancel()
        self.server.shutdown()
        self.server.server_close()

    def unreachable(self, seconds: float, services: tuple[str, ...] | None = None) -> None:
        """Stop forwarding (reset every connection) for `seconds`, from now: for `services`, or all."""
        self.down_services = services
        self.down.set()
        timer = threading.Timer(seconds, self.down.clear)
        timer.daemon = True
        timer.start()

    # --- one request -----------------------------------------------------------------------
    def _choose(self, service: str) -> str | None:
        with self.lock:
            self.requests += 1
            over = self.requests > self.plan.max_requests or time.monotonic() - self.started > self.plan.max_lifetime_s
            if over:
                return "reset"
            if service in self.plan.services and self.failed_first[service] < self.plan.fail_first:
                self.failed_first[service] += 1
                return self.plan.kinds[(self.failed_first[service] - 1) % len(self.plan.kinds)]
            if self.requests <= self.plan.spare_first or service not in self.plan.services:
                return None
            if self.plan.fraction <= 0:
                return None
            if service not in self.schedules:
                self.schedules[service] = FaultSchedule(self.plan.fraction, f"{self.plan.seed}:{service}")
            schedule = self.schedules[service]
            index = self.eligible[service]
            self.eligible[service] += 1
            if not schedule.faults(index):
                return None
            # Kinds take turns per service, so a short run still meets every one of them.
            turn = self.turns[service]
            self.turns[service] += 1
            return self.plan.kinds[turn % len(self.plan.kinds)]

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        with self.lock:
            arrival = self.arrivals
            self.arrivals += 1
        try:
            self._handle(request, arrival)
        finally:
            with self.answered:
                self.last_answered_arrival = max(self.last_answered_arrival, arrival)
                self.answered.notify_all()

    def _hold_until_overtaken(self, arrival: int, service: str) -> None:
        """Wait until a request that arrived after this one has been answered."""
        with self.answered:
            overtaken = self.answered.wait_for(
                lambda: self.last_answered_arrival > arrival, timeout=self.plan.hold_limit_s
            )
            (self.stats.overtaken if overtaken else self.stats.held_to_the_limit)[service] += 1

    def _handle(self, request: BaseHTTPRequestHandler, arrival: int) -> None:
        body = self._read_body(request)
        match = SCOPE.search(request.headers.get("Authorization", ""))
        service = match.group(1) if match else "unknown"
        if self.down.is_set() and (self.down_services is None or service in self.down_services):
            self.stats.refused_while_down += 1
            self._reset(request)
            return
        secure = isinstance(request.connection, ssl.SSLSocket)  # how this request reached us
        if (
            service == "s3"
            and self.gate is not None
            and self.gate.refuses(request.command, request.path, dict(request.headers.items()), secure_transport=secure)
        ):
            self._error(request, service, 403)
            return
        if self.plan.lose_answer_of and urlparse(request.path).path.endswith(self.plan.lose_answer_of):
            with self.lock:
                lose = request.command == "PUT" and not self.stats.answers_lost
                throttle = request.command == "GET" and self.reads_to_throttle > 0
                self.stats.answers_lost += lose
                self.reads_to_throttle += self.plan.throttled_reads_after if lose else -throttle
                self.stats.reads_throttled += throttle
            if lose:  # S3 takes it; the answer never reaches the client
                self._forward(request, body, service, answer=False)
                self._error(request, service, 500)
                return
            if throttle:
                self._error(request, service, 503)
                return
        fault = self._choose(service)
        if fault is not None:
            self.stats.injected[f"{service}:{fault}"] += 1
        if fault == "reset":
            self._reset(request)
            return
        if fault in ("error_500", "slow_down_503"):
            self._error(request, service, 500 if fault == "error_500" else 503)
            return
        if fault == "latency":
            time.sleep(self.plan.latency_s)
        if fault == OVERTAKEN:
            self._hold_until_overtaken(arrival, service)
        self.stats.forwarded[service] += 1
        self._forward(request, body, service)

    @staticmethod
    def _read_body(request: BaseHTTPRequestHandler) -> bytes:
        if request.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(request.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    while request.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return data
                data += request.rfile.read(size)
                request.rfile.readline()
        length = int(request.headers.get("Content-Length", 0) or 0)
        return request.rfile.read(length) if length else b""

    @staticmethod
    def _reset(request: BaseHTTPRequestHandler) -> None:
        request.close_connection = True
        try:
            request.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            request.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    @staticmethod
    def _error(request: BaseHTTPRequestHandler, service: str, status: int) -> None:
        if service == "s3":
            code = {500: "InternalError", 503: "SlowDown", 403: "AccessDenied"}[status]
            payload = (
                f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>injected</Message></Error>"
            )
            content_type = "application/xml"
        else:
            code = "InternalFailure" if status == 500 else "Throttling"
            payload = (
                "<ErrorResponse><Error><Type>Receiver</Type>"
                f"<Code>{code}</Code><Message>injected</Message></Error></ErrorResponse>"
            )
            content_type = "text/xml"
        data = payload.encode()
        request.send_response(status)
        request.send_header("Content-Type", content_type)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def _forward(self, request: BaseHTTPRequestHandler, body: bytes, service: str, *, answer: bool = True) -> None:
        connection = http.client.HTTPConnection(str(self.upstream.hostname), self.upstream.port, timeout=30)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Content-Length"] = str(len(body))
        try:
            connection.request(request.command, request.path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except OSError:
            self._reset(request)
            return
        finally:
            connection.close()
        self.stats.upstream_status[(service, response.status)] += 1
        if not answer:
            return
        request.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                request.send_header(key, value)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        if request.command != "HEAD":
            request.wfile.write(data)
