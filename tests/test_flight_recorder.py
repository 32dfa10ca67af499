"""The flight recorder (issue 17): each rank's dump as torch 2.13 records gloo collectives, written by the
runtime (`beacon.evidence.flight_recorder`), and read by PyTorch's own analyser in the doctor
(`beacon_ops.doctor.flight_recorder`). The dumps come from a real 2-rank gloo run, not from pickles
written here."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from beacon.contract.rank_evidence import flight_recorder_name

from beacon_ops.doctor.flight_recorder import NO_TORCH, Mismatch, read_flight_recorder
from tests.support.synth import ROOT
from tests.test_ranks import free_port

# Rank 1 skips the world group's 4th collective; rank 0 issues it (async: it never completes) and both
# dump. Beacon's own gloo group is there too, as `World.of_current_group` makes it.
TWO_RANKS = """
import os, sys
from pathlib import Path
import torch
import torch.distributed as dist
from beacon.contract.rank_evidence import flight_recorder_name
from beacon.evidence.flight_recorder import dump_flight_recorder

dist.init_process_group("gloo")
rank = dist.get_rank()
beacon = dist.new_group(backend="gloo", group_desc="beacon")
dist.all_reduce(torch.ones(1), group=beacon)
for _ in range(3):
    dist.all_reduce(torch.ones(4))
if rank == 0:
    dist.all_reduce(torch.ones(4), async_op=True)
dist.barrier(group=beacon)  # both have issued what they will before either dumps
assert dump_flight_recorder(Path(sys.argv[1]) / flight_recorder_name(rank))
os._exit(0)  # rank 0's last collective never completes: no teardown
"""


def hide_the_analyser(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in the alarm's function, which has no torch: importing the analyser fails."""
    for name in ("torch.distributed.flight_recorder", "torch.distributed.flight_recorder.components"):
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture(scope="module")
def two_rank_dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    folder = tmp_path_factory.mktemp("ranks")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    env["TORCH_FR_BUFFER_SIZE"] = "100"  # before the process group is made: torch reads it then
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", TWO_RANKS, str(folder)],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [rank.communicate(timeout=120)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    return {f"ranks/attempt-00000/{path.name}": path.read_bytes() for path in sorted(folder.iterdir())}


def test_gloo_collectives_are_recorded_and_the_dump_names_every_process_group(two_rank_dumps: dict[str, bytes]) -> None:
    assert sorted(two_rank_dumps) == [f"ranks/attempt-00000/{flight_recorder_name(r)}" for r in (0, 1)]
    dump = pickle.loads(two_rank_dumps[f"ranks/attempt-00000/{flight_recorder_name(0)}"])
    names = [(entry["process_group"], entry["profiling_name"]) for entry in dump["entries"]]
    assert names.count((("0", "default_pg"), "gloo:all_reduce")) == 4, names
    # torch's own pg_config under gloo is one unnamed entry; the runtime's dump lists the groups
    assert dump["pg_config"]["0"] == {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}
    assert {group["desc"] for group in dump["pg_config"].values()} == {"default_pg", "beacon"}
    assert "" not in dump["pg_config"]


def test_torchs_analyser_names_the_collective_rank_1_never_joined(two_rank_dumps: dict[str, bytes]) -> None:
    reading = read_flight_recorder(two_rank_dumps)
    assert reading is not None and not reading.unread, reading
    assert reading.mismatch == Mismatch(
        operation="gloo:all_reduce", sequence_id=4, group="0:default_pg", joined=[0], missing=[1]
    )
    assert reading.line() == (
        "first mismatched collective: gloo:all_reduce #4 in process group 0:default_pg, joined by rank(s) 0; "
        "rank(s) 1 did not join"
    )


def test_dumps_that_all_ranks_match_show_no_mismatch(two_rank_dumps: dict[str, bytes]) -> None:
    """Rank 0's dump alone, with the recorder's last entry (the one rank 1 skipped) taken off."""
    key = f"ranks/attempt-00000/{flight_recorder_name(0)}"
    dump = pickle.loads(two_rank_dumps[key])
    dump["entries"] = [e for e in dump["entries"] if e["collective_seq_id"] != 4 or e["process_group"][0] != "0"]
    rank_1 = f"ranks/attempt-00000/{flight_recorder_name(1)}"
    reading = read_flight_recorder({key: pickle.dumps(dump), rank_1: two_rank_dumps[rank_1]})
    assert reading is not None and reading.mismatch is None and not reading.unread, reading


def test_without_torch_the_reading_says_where_the_dumps_are_and_who_reads_them(
    two_rank_dumps: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    hide_the_analyser(monkeypatch)
    reading = read_flight_recorder(two_rank_dumps)
    assert reading is not None and reading.unread == NO_TORCH and reading.mismatch is None
    assert reading.keys == sorted(two_rank_dumps)
    assert reading.line() == (
        f"flight-recorder dumps of rank(s) 0, 1 at ranks/attempt-00000/flight-recorder-rank-<rank>: {NO_TORCH}"
    )


def test_a_dump_that_would_run_code_is_refused_before_torch_unpickles_it(
    two_rank_dumps: dict[str, bytes], tmp_path: Path
) -> None:
    hostile = pickle.dumps(Path(tmp_path))  # names a class: unpickling it calls code
    keys = sorted(two_rank_dumps)
    reading = read_flight_recorder({keys[0]: two_rank_dumps[keys[0]], keys[1]: hostile})
    assert reading is not None and reading.unread.startswith("PyTorch's analyser cannot read them: UnpicklingError")


def test_no_torch_distributed_no_dump_and_no_import(tmp_path: Path) -> None:
    """A process that never made a process group writes nothing and imports nothing of torch."""
    code = (
        "import sys; from pathlib import Path; from beacon.evidence.flight_recorder import dump_flight_recorder; "
        "assert not dump_flight_recorder(Path(sys.argv[1]) / 'flight-recorder-rank-0'); "
        "assert 'torch' not in sys.modules; print('ok')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "ok", done.stderr
    assert not list(tmp_path.iterdir())


# One rank's RankSignal, as `beacon.init` starts it, asked for dumps from the main thread as the SIGTERM
# handler asks; which thread writes the flight recorder is recorded.
SIGTERM_DUMPS = """
import pickle, sys, threading, time
from pathlib import Path
import torch
import torch.distributed as dist
from beacon.evidence import ranks
from beacon.evidence.progress import ProgressClock

writers = []
dump = ranks.dump_flight_recorder
ranks.dump_flight_recorder = lambda path: writers.append(threading.current_thread().name) or dump(path)
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[2], 1), rank=0, world_size=1)
directory = Path(sys.argv[1])
progress = ProgressClock()
progress.dispatched_step = 5
signal = ranks.RankSignal(
    directory, rank=0, local_rank=0, world_size=1, progress=progress, interval=0.2, stall_dump_after=600
).start()

def recorded(count):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if len(pickle.loads((directory / "flight-recorder-rank-0").read_bytes())["entries"]) == count:
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False

dist.all_reduce(torch.ones(1))
signal.dump_stacks("received SIGTERM")
assert recorded(1)
dist.all_reduce(torch.ones(1))
signal.dump_stacks("received SIGTERM")
time.sleep(1)
assert recorded(1), "still at step 5: the dump taken at that step stands"
progress.dispatched_step = 6
signal.dump_stacks("received SIGTERM")
assert recorded(2), "a later step: a new dump"
signal.stop()
assert set(writers) == {"beacon-rank-signal"}, writers
print("ok")
"""


def test_a_sigterm_dump_is_written_by_the_rank_signal_thread_and_keeps_the_dump_of_its_step(tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    done = subprocess.run(
        [sys.executable, "-c", SIGTERM_DUMPS, str(ranks), str(tmp_path / "store")],
        env={**os.environ, "TORCH_FR_BUFFER_SIZE": "100"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip() == "ok", done.stdout + done.stderr
