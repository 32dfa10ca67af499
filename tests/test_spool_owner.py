"""One owner per spool directory (issue 26 finding 2): a live owner refuses a second, a dead or expired one is
taken over, and the one taken over is told at its next renewal. Leases on an injected clock; two real
processes on one directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from beacon.log.spool import Spool
from beacon.log.spool_owner import (
    OWNER,
    OWNER_LEASE_S,
    OWNER_RENEW_S,
    SpoolOwnedError,
    SpoolOwner,
    SpoolTakenOverError,
    read_owner,
)

from tests.support.synth import ROOT


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


HOLDER = """
import sys, time
from pathlib import Path
from beacon.log.spool_owner import SpoolOwner
owner = SpoolOwner.claim(Path(sys.argv[1]), run="r")
print("claimed", flush=True)
time.sleep(120)
"""


@pytest.fixture
def live_owner(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """Another process on this host that owns `tmp_path / 'e' / 'r'` and keeps running."""
    directory = tmp_path / "e" / "r"
    script = tmp_path / "holder.py"
    script.write_text(textwrap.dedent(HOLDER))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'runtime'}"}
    holder = subprocess.Popen([sys.executable, str(script), str(directory)], stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
    yield directory, holder
    holder.kill()
    holder.wait()


def test_a_second_process_is_refused_naming_the_live_owner(live_owner: tuple[Path, subprocess.Popen[str]]) -> None:
    directory, holder = live_owner
    with pytest.raises(SpoolOwnedError) as refused:
        SpoolOwner.claim(directory, run="r")
    line = str(refused.value)
    assert "\n" not in line and "run 'r'" in line and f"pid {holder.pid}" in line and "renewed 0 s ago" in line


def test_an_owner_that_died_on_this_host_is_taken_over_at_once(live_owner: tuple[Path, subprocess.Popen[str]]) -> None:
    directory, holder = live_owner
    holder.kill()
    holder.wait()
    owner = SpoolOwner.claim(directory, run="r")
    assert read_owner(directory) == owner.record and owner.record.pid == os.getpid()


def test_an_owner_on_another_host_owns_until_its_lease_expires(tmp_path: Path) -> None:
    clock = Clock()
    SpoolOwner.claim(tmp_path, run="r", clock=clock)
    record = json.loads((tmp_path / OWNER).read_text())
    (tmp_path / OWNER).write_text(json.dumps({**record, "host": "pod-old", "pod": "pod-old"}))
    clock.now += OWNER_LEASE_S - 1
    with pytest.raises(SpoolOwnedError, match=r"host pod-old, pid \d+, renewed 59 s ago"):
        SpoolOwner.claim(tmp_path, run="r", clock=clock)
    clock.now += 2
    replacement = SpoolOwner.claim(tmp_path, run="r", clock=clock)
    assert read_owner(tmp_path) == replacement.record


def test_an_owner_whose_lease_expired_is_told_at_its_next_renewal_and_its_release_keeps_the_new_owner(
    tmp_path: Path,
) -> None:
    clock = Clock()
    old = SpoolOwner.claim(tmp_path, run="r", clock=clock, pid=1)  # as if on another host: its pid is not ours
    record = json.loads((tmp_path / OWNER).read_text())
    (tmp_path / OWNER).write_text(json.dumps({**record, "host": "pod-old"}))
    old.record = read_owner(tmp_path)  # type: ignore[assignment]
    clock.now += OWNER_LEASE_S + 1  # frozen, or cut off: it did not renew
    new = SpoolOwner.claim(tmp_path, run="r", clock=clock)
    clock.now += OWNER_RENEW_S
    with pytest.raises(SpoolTakenOverError, match=r"taken over by host .*after this process's lease expired"):
        old.renew()
    old.release()
    assert read_owner(tmp_path) == new.record, "the new owner's record stays"


def test_renewal_moves_the_lease_on_and_release_frees_the_directory_for_the_next_writer(tmp_path: Path) -> None:
    clock = Clock()
    owner = SpoolOwner.claim(tmp_path, run="r", clock=clock)
    clock.now += OWNER_RENEW_S - 1
    owner.renew()
    assert read_owner(tmp_path).renewed == 1_000.0, "renewed at most every OWNER_RENEW_S"  # type: ignore[union-attr]
    clock.now += 1
    owner.renew()
    assert read_owner(tmp_path).renewed == clock.now  # type: ignore[union-attr]
    owner.release()
    assert read_owner(tmp_path).released_at == clock.now  # type: ignore[union-attr]


def test_a_spool_with_an_owner_renews_as_it_syncs_and_releases_at_close(tmp_path: Path) -> None:
    clock = Clock()
    spool = Spool(tmp_path, owner=SpoolOwner.claim(tmp_path, run="r", clock=clock))
    clock.now += OWNER_RENEW_S
    spool.sync()
    assert read_owner(tmp_path).renewed == clock.now  # type: ignore[union-attr]
    spool.close()
    assert read_owner(tmp_path).released_at is not None  # type: ignore[union-attr]


def test_a_torn_owner_record_owns_nothing(tmp_path: Path) -> None:
    (tmp_path / OWNER).write_text('{"host": "pod-old", "pid": ')  # its writer died mid-write
    assert read_owner(tmp_path) is None
    SpoolOwner.claim(tmp_path, run="r")
