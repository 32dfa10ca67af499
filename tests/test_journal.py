"""A SIGKILL right after `run.log` loses no step: the journal on the spool volume keeps what the spool
thread had not yet fsync'd, and the next start (or `beacon.sync`) spools it first, once."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from beacon.contract import Record, history, records_of
from beacon.log import journal as journal_module
from beacon.log.journal import BACKLOG, DATA_START, ENTRY, Journal
from beacon.log.spool import Spool, SpoolFullError

from tests.support.synth import ROOT

LOGGED_THEN_KILLED = """
import sys, time
from pathlib import Path
from beacon.evidence.progress import ProgressClock
from beacon.settings import RunSettings
from beacon.log.spool import Spool
from beacon.telemetry import Telemetry

spool = Spool(Path(sys.argv[1]))
settings = RunSettings(experiment="exp", run="run-1", bucket="bucket", alarms=False)
# The sinks' threads never start: no step reaches the spool but through the journal.
telemetry = Telemetry(settings, s3=None, cloudwatch=None, progress=ProgressClock(), spool=spool, run_alarms=None)
telemetry.begin_attempt()
for step in range(int(sys.argv[2])):
    telemetry.log(step, {"loss": 1.0 / (step + 1), "lr": 0.1, "tokens": step * 512})
print("ready", flush=True)  # right after the last log call
time.sleep(120)
"""


def spooled(directory: Path) -> list[Record]:
    spool = Spool(directory)
    spool.recover_journal()  # as `reconcile` does, after it learnt what S3 holds
    try:
        return [record for chunk in spool.pending() for record in records_of(chunk.body())]
    finally:
        spool.close()


def test_every_step_logged_before_a_sigkill_is_spooled_on_the_next_start_once(tmp_path: Path) -> None:
    directory = tmp_path / "spool" / "exp" / "run-1"
    process = subprocess.Popen(
        [sys.executable, "-c", LOGGED_THEN_KILLED, str(directory), "2000"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)

    records = spooled(directory)
    assert [r.step for r in records] == list(range(2000))
    assert {(r.experiment, r.run, r.attempt) for r in records} == {("exp", "run-1", 0)}
    assert records[7].metrics == {"loss": 1.0 / 8, "lr": 0.1, "tokens": 7 * 512.0}
    assert [r.seq for r in records] == list(range(2000)), "numbered like any spooled record"
    assert spooled(directory) == records, "a second start recovers nothing again"


def test_steps_the_spool_fsynced_before_the_journal_was_marked_are_not_spooled_twice(tmp_path: Path) -> None:
    directory = tmp_path / "exp" / "run-1"
    spool = Spool(directory)
    attempt = spool.begin_attempt()
    for step in range(5):
        spool.journal.append(step, 100.0 + step, {"loss": 1.0})
    spool.append([Record("exp", "run-1", step, {"loss": 1.0}, 100.0 + step, attempt=attempt) for step in range(3)])
    spool.sync()  # killed here: steps 0-2 fsync'd, the journal not yet told
    records = spooled(directory)
    assert [r.step for r in records] == [0, 1, 2, 3, 4]
    assert not history(records).duplicated


def test_a_torn_entry_ends_the_journal_and_an_old_epoch_is_never_read(tmp_path: Path) -> None:
    journal = Journal(tmp_path, capacity=4096)
    sizes = [journal.append(step, 1.0, {"loss": 0.5}) for step in range(3)]
    assert sizes == [1, 2, 3]
    entry_size = (journal._position - DATA_START) // 3
    journal._map[DATA_START + 2 * entry_size + ENTRY.size] ^= 0xFF  # the kill tore step 2's payload
    assert [step for step, *_ in journal.unspooled()] == [0, 1]
    journal.restart(attempt=1)
    # Same-sized entries of the new epoch end where old ones began: the epoch keeps them apart.
    journal.append(10, 1.0, {"loss": 0.5})
    assert [step for step, *_ in journal.unspooled()] == [10]
    journal.durable_through(1)
    assert list(journal.unspooled()) == []


def test_a_tensor_value_is_left_to_the_spool_thread_and_a_ring_of_unfsynced_steps_is_never_overwritten(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path, capacity=DATA_START + 200)
    # Reading a tensor would wait for the device: its step is journaled with its plain values, the tensor named
    assert journal.append(0, 1.0, {"loss": torch.tensor(0.5), "lr": 0.1}) == 1
    assert list(journal.unspooled()) == [(0, 1.0, {"lr": 0.1}, ["loss"])]
    assert journal.append(0, 1.0, {"loss": 0.5}) == 2
    while journal.append(1, 1.0, {"loss": 0.5}):
        pass
    assert journal.skipped == 1
    written = journal._number
    journal.durable_through(written)  # the spool caught up: the ring may wrap
    assert journal.append(2, 1.0, {"loss": 0.5}) == written + 1
    assert [step for step, *_ in journal.unspooled()] == [2]


def eight_steps_journaled(directory: Path) -> tuple[Spool, int]:
    """A fresh spool whose attempt journaled steps 0-7 (at 100 s + step) and spooled none of them yet."""
    spool = Spool(directory)
    spool.recover_journal()
    attempt = spool.begin_attempt()
    for step in range(8):
        spool.journal.append(step, 100.0 + step, {"loss": 1.0})
    return spool, attempt


def test_recovered_steps_are_numbered_after_and_never_repeat_what_s3_holds(tmp_path: Path) -> None:
    directory = tmp_path / "exp" / "run-1"
    _killed, attempt = eight_steps_journaled(directory)
    # Killed. Steps 0-4 had been spooled, sealed, delivered and dropped from the volume: only S3 has them.
    in_s3 = [Record("exp", "run-1", step, {"loss": 1.0}, 100.0 + step, seq=step, attempt=attempt) for step in range(5)]
    restarted = Spool(directory)
    restarted.continue_after(chunk=0, seq=4, step=4, attempt=attempt)  # what `reconcile` learns from S3
    restarted.remember(in_s3)
    assert restarted.recover_journal() == 3
    (chunk,) = restarted.pending()
    assert chunk.sequence == 1
    assert [(r.step, r.seq) for r in records_of(chunk.body())] == [(5, 5), (6, 6), (7, 7)]
    assert restarted.recover_journal() == 0, "once"


def test_only_plain_numbers_are_journaled_as_values_and_an_unreadable_value_costs_its_step_nothing_else(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path)
    assert journal.append(0, 1.0, {"loss": None}) == 1, "not a plain number: named as pending, not read"
    assert journal.append(1, 1.0, {"loss": 10**400, "lr": 0.1}) == 2, "an int is plain, even one float() refuses"
    assert journal.append(2, 1.0, {"loss": 0.5, "ok": True}) == 3
    assert list(journal.unspooled()) == [
        (0, 1.0, {}, ["loss"]),
        (1, 1.0, {"lr": 0.1}, ["loss"]),  # the value named as lost, the step and its other values kept
        (2, 1.0, {"loss": 0.5, "ok": 1.0}, []),
    ]


def test_a_journal_an_older_release_wrote_reads_with_nothing_pending(tmp_path: Path) -> None:
    """Its entries are (step, wall time, metrics), before pending names existed: read as they were."""
    journal = Journal(tmp_path)
    journal.append(0, 1.0, {"loss": 0.5})
    assert list(journal.unspooled()) == [(0, 1.0, {"loss": 0.5}, [])]


def test_a_journal_that_does_not_fit_the_spool_volume_is_a_full_spool_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(SpoolFullError, match="spool"):
        Spool(tmp_path / "exp" / "run-1")


def test_a_step_larger_than_the_whole_ring_is_skipped_and_counted_and_the_next_one_journaled(tmp_path: Path) -> None:
    """Issue 26 finding 6: it was `IndexError: mmap slice assignment is wrong size` from the training thread."""
    journal = Journal(tmp_path, capacity=16 * 1024)
    assert journal.append(0, 1.0, {f"m{i:05d}": float(i) for i in range(5_000)}) == 0
    assert journal.skipped == 1
    assert journal.append(1, 2.0, {"loss": 0.5}) == 1
    assert [step for step, *_ in journal.unspooled()] == [1]


def test_a_kill_while_recovery_seals_the_journals_steps_spools_each_step_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps 0-4 were fsync'd into a sealed chunk but the journal never marked them; 5-7 were journaled alone. The
    next start spools and seals 5-7 and is killed before it goes on: the start after must not spool 0-4 again (it
    knows only the newest chunk's records), so the journal lets go of its steps before the seal."""
    directory = tmp_path / "exp" / "run-1"
    spool, attempt = eight_steps_journaled(directory)
    spool.append([Record("exp", "run-1", step, {"loss": 1.0}, 100.0 + step, attempt=attempt) for step in range(5)])
    spool.sync()
    spool.seal()  # killed here: the journal's mark never moved past step 0-4's entries
    restarted = Spool(directory)

    def killed(*args: object) -> None:
        raise KeyboardInterrupt("SIGKILL while sealing the recovered steps")

    monkeypatch.setattr(restarted, "_open_chunk", killed)  # sealed, then killed before the next chunk opens
    with pytest.raises(KeyboardInterrupt):
        restarted.recover_journal()
    monkeypatch.undo()
    again = Spool(directory)
    again.recover_journal()
    steps = sorted(r.step for chunk in again.pending() for r in records_of(chunk.body()))
    assert steps == list(range(8)), "each step once"


# --- the backlog: past the spool writer's memory bound ------------------------------------------------------------
def test_the_backlog_shares_the_rings_numbers_and_recovery_reads_both_in_the_order_logged(tmp_path: Path) -> None:
    journal = Journal(tmp_path, capacity=4096)
    assert [journal.append(step, 1.0, {"loss": 0.5}) for step in (0, 1)] == [1, 2]
    with journal.backlog_lock:
        assert [journal.overflow(step, 1.0, {"loss": 0.5}, []) for step in (2, 3)] == [3, 4]
    assert journal.append(4, 1.0, {"loss": 0.5}) == 5, "the ring goes on after the backlog's numbers"
    assert [step for step, *_ in journal.unspooled()] == [0, 1, 2, 3, 4]
    journal.durable_through(3)
    assert [step for step, *_ in journal.unspooled()] == [3, 4], "the spool's fsync marks both"
    journal.restart(attempt=1)
    assert list(journal.unspooled()) == [] and (tmp_path / BACKLOG).stat().st_size == 0


def test_the_spool_thread_reads_the_backlog_a_read_at_a_time_and_it_is_emptied_once_all_is_durable(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path, capacity=4096)
    with journal.backlog_lock:
        for step in range(10):
            journal.overflow(step, 1.0, {"loss": 0.5, "lr": 0.1}, ["grad_norm"] if step == 4 else [])
    first, used = journal.read_backlog(limit=1)  # less than one entry: that entry, whole
    assert [(n, step) for n, step, *_ in first] == [(1, 0)]
    with journal.backlog_lock:
        assert not journal.consumed(used)
    rest, used = journal.read_backlog(limit=1 << 20)
    with journal.backlog_lock:
        assert journal.consumed(used), "read to the end"
    assert [step for _, step, *_ in rest] == list(range(1, 10))
    assert rest[3][3:] == ({"loss": 0.5, "lr": 0.1}, ["grad_norm"]), "a value the loop could not read, named"
    journal.reclaim_backlog()
    assert (tmp_path / BACKLOG).stat().st_size > 0, "read but not yet durable: kept for recovery"
    journal.durable_through(10)
    journal.reclaim_backlog()
    assert (tmp_path / BACKLOG).stat().st_size == 0, "read and fsync'd in the spool: its disk is free again"
    with journal.backlog_lock:
        journal.overflow(10, 1.0, {"loss": 0.5}, [])
    assert [step for _, step, *_ in journal.read_backlog(limit=1 << 20)[0]] == [10]


def test_recovery_reads_a_backlog_larger_than_its_slice_whole_and_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_module, "BACKLOG_SLICE", 100)  # a few entries a read, entries cut at its edges
    journal = Journal(tmp_path, capacity=4096)
    with journal.backlog_lock:
        for step in range(50):
            journal.overflow(step, 1.0, {"loss": 0.5, "tokens": 10**400 if step == 7 else step}, [])
    journal.append(50, 1.0, {"loss": 0.5})
    recovered = list(journal.unspooled())
    assert [step for step, *_ in recovered] == list(range(51))
    assert recovered[7][2:] == ({"loss": 0.5}, ["tokens"]), "a value past a float's range: that value, named"


def test_a_backlog_write_the_volume_refuses_is_cut_back_and_the_steps_before_it_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal(tmp_path, capacity=4096)
    real_write = os.write
    with journal.backlog_lock:
        journal.overflow(0, 1.0, {"loss": 0.5}, [])

        def full(descriptor: int, data: bytes) -> int:
            real_write(descriptor, data[:7])  # part of the entry, then the volume is full
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", full)
        with pytest.raises(OSError, match="No space"):
            journal.overflow(1, 1.0, {"loss": 0.5}, [])
        monkeypatch.setattr(os, "write", real_write)
        journal.overflow(2, 1.0, {"loss": 0.5}, [])
    assert [step for step, *_ in journal.unspooled()] == [0, 2], "the refused step was never acknowledged"


def test_steps_recovered_from_the_journal_are_durable_to_the_mirrors_that_read_the_spool(tmp_path: Path) -> None:
    """A sync reads no new step: what recovery fsync'd must count as durable, or a mirror stops short of it."""
    directory = tmp_path / "exp" / "run-1"
    spool = Spool(directory)
    spool.begin_attempt()
    for step in range(5):
        spool.journal.append(step, 100.0 + step, {"loss": 1.0})
    spool.close()  # killed: nothing reached the spool but the journal
    spool = Spool(directory)
    assert spool.recover_journal() == 5
    assert spool.durable_seq == 4
    spool.close()
