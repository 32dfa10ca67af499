"""Preflight in isolation: which errors it retries within its budget, which end it at once, and what
it calls a spool that would not outlive the pod. Fake clocks, fake mount tables, no AWS."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from beacon.process.preflight import PREFLIGHT_BUDGET_S, REFUSED_BUDGET_S, PreflightError, Retrying, check_spool
from beacon.settings import RunSettings
from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError, ReadTimeoutError
from smoke_job.config import parse_args

LOCAL = SimpleNamespace(meta=SimpleNamespace(endpoint_url="http://127.0.0.1:9"))
UNRESOLVABLE = SimpleNamespace(meta=SimpleNamespace(endpoint_url="https://s3.beacon-test.invalid"))


def client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


TRANSIENT = {
    "500": lambda: client_error("InternalFailure", 500),
    "503_slow_down": lambda: client_error("SlowDown", 503),
    "throttling": lambda: client_error("Throttling", 400),
    "reset": lambda: ConnectionClosedError(endpoint_url="http://127.0.0.1:9"),
    "read_timeout": lambda: ReadTimeoutError(endpoint_url="http://127.0.0.1:9"),
    "refused": lambda: EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
}


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def retrying(clock: FakeTime) -> Retrying:
    return Retrying(now=lambda: clock.now, sleep=clock.sleep)


def failing(errors: list[BaseException], result: str = "ok") -> Any:
    def operation() -> str:
        if errors:
            raise errors.pop(0)
        return result

    return operation


@pytest.mark.parametrize("kind", sorted(TRANSIENT))
def test_a_transient_error_that_clears_is_retried_and_preflight_passes(kind: str) -> None:
    clock = FakeTime()
    errors = [TRANSIENT[kind](), TRANSIENT[kind]()]
    assert retrying(clock).call(failing(errors), action="s3:PutObject", target="t", client=LOCAL) == "ok"
    assert len(clock.sleeps) == 2 and clock.now < 2


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (client_error("AccessDenied", 403), "denied (AccessDenied)"),
        (client_error("NoSuchBucket", 404), "no such bucket"),
        (client_error("ParameterNotFound", 400), "not found; deploy the team's monitoring stack"),
    ],
)
def test_a_definitive_error_fails_at_once(error: ClientError, expected: str) -> None:
    clock = FakeTime()
    with pytest.raises(PreflightError, match=re.escape(expected)):
        retrying(clock).call(failing([error]), action="s3:PutObject", target="t", client=LOCAL)
    assert clock.sleeps == []


def test_an_unresolvable_endpoint_fails_at_once() -> None:
    clock = FakeTime()
    error = EndpointConnectionError(endpoint_url=UNRESOLVABLE.meta.endpoint_url)
    with pytest.raises(PreflightError, match="does not resolve"):
        retrying(clock).call(failing([error]), action="s3:PutObject", target="t", client=UNRESOLVABLE)
    assert clock.sleeps == []


def test_a_refused_connection_that_persists_fails_once_it_is_older_than_its_budget() -> None:
    clock = FakeTime()
    errors = [TRANSIENT["refused"]() for _ in range(100)]
    with pytest.raises(PreflightError, match=r"unreachable after \d+ attempts"):
        retrying(clock).call(failing(errors), action="s3:PutObject", target="t", client=LOCAL)
    assert REFUSED_BUDGET_S - 2 <= clock.now <= REFUSED_BUDGET_S


def test_transient_errors_are_retried_only_within_one_budget_for_the_whole_preflight() -> None:
    clock = FakeTime()
    retry = retrying(clock)
    assert retry.call(failing([TRANSIENT["500"]() for _ in range(5)]), action="a", target="t", client=LOCAL) == "ok"
    spent = clock.now
    with pytest.raises(PreflightError, match="InternalFailure after"):
        retry.call(failing([TRANSIENT["500"]() for _ in range(100)]), action="b", target="t", client=LOCAL)
    assert spent < clock.now <= PREFLIGHT_BUDGET_S


# --- the spool --------------------------------------------------------------------------------------
def config(*extra: str) -> Any:
    return parse_args(["--bucket", "b", *extra]).settings


def test_a_full_disk_is_reported_as_a_full_disk_not_as_ownership(tmp_path: Path, monkeypatch: Any) -> None:
    def full(_descriptor: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(PreflightError, match="disk full") as raised:
        check_spool(config(), tmp_path / "spool")
    assert "ownership" not in str(raised.value)


def test_a_read_only_volume_is_reported_as_read_only_not_as_ownership(tmp_path: Path, monkeypatch: Any) -> None:
    real_open = open

    def read_only(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith(str(tmp_path / "spool")):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", read_only)
    expected = "mounted read-only (Read-only file system); mount it read-write"
    with pytest.raises(PreflightError, match=re.escape(expected)) as raised:
        check_spool(config(), tmp_path / "spool")
    assert "ownership" not in str(raised.value)


def test_the_advice_for_a_missing_alarm_template_names_settings_that_exist() -> None:
    """The fix a preflight gives is one the library takes: both spellings it names resolve to no alarms."""
    with pytest.raises(PreflightError) as raised:
        retrying(FakeTime()).call(
            failing([client_error("ParameterNotFound", 400)]), action="ssm:GetParameter", target="t", client=LOCAL
        )
    variable = re.search(r"(BEACON_[A-Z_]+)=false", str(raised.value))
    keyword = re.search(r"beacon\.init\((\w+)=False\)", str(raised.value))
    assert variable and keyword, str(raised.value)
    from_environment = RunSettings.resolve({variable.group(1): "false", "BEACON_BUCKET": "b"})
    from_keyword = RunSettings.resolve({"BEACON_BUCKET": "b"}, **{keyword.group(1): False})
    assert from_environment.alarms is False and from_keyword.alarms is False
    assert "--alarms" not in str(raised.value), "a flag of the smoke job alone, not of the library"


def mounts(tmp_path: Path, spool_line: str) -> Path:
    """A container's /proc/mounts: the kubelet's files from the node's disk, and the spool's volume."""
    table = tmp_path / "mounts"
    table.write_text(
        "overlay / overlay rw,relatime,lowerdir=/var/lib/containerd/a 0 0\n"
        "/dev/nvme0n1p1 /etc/hosts xfs rw,noatime 0 0\n"
        "/dev/nvme0n1p1 /dev/termination-log xfs rw,noatime 0 0\n"
        "/dev/nvme0n1p1 /etc/hostname xfs rw,noatime 0 0\n"
        f"{spool_line.format(spool=tmp_path / 'volume')}\n"
    )
    return table


VOLUMES = {
    "emptyDir": ("/dev/nvme0n1p1 {spool} xfs rw,noatime 0 0", False),
    "hostPath": ("/dev/nvme0n1p1 {spool} xfs rw,noatime 0 0", False),
    "efs": ("127.0.0.1:/ {spool} nfs4 rw,relatime,vers=4.1 0 0", True),
    "ebs_pvc": ("/dev/nvme1n1 {spool} ext4 rw,relatime 0 0", True),
}


@pytest.mark.parametrize("volume", sorted(VOLUMES))
def test_in_kubernetes_a_spool_on_the_nodes_own_disk_is_refused_like_tmpfs(tmp_path: Path, volume: str) -> None:
    line, persistent = VOLUMES[volume]
    table = mounts(tmp_path, line)
    spool = tmp_path / "volume" / "spool"
    if persistent:
        assert check_spool(config(), spool, mounts_table=table, kubernetes=True)[1] is True
        return
    with pytest.raises(PreflightError, match=r"the node.s own disk .*emptyDir or hostPath.*does not outlive the pod"):
        check_spool(config(), spool, mounts_table=table, kubernetes=True)
    assert check_spool(config("--allow-ephemeral-spool", "true"), spool, mounts_table=table, kubernetes=True) == (
        "xfs",
        False,
    )


def test_outside_kubernetes_a_local_disk_is_the_persistent_volume(tmp_path: Path) -> None:
    table = mounts(tmp_path, VOLUMES["emptyDir"][0])
    assert check_spool(config(), tmp_path / "volume" / "spool", mounts_table=table, kubernetes=False) == ("xfs", True)
