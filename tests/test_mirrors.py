"""Tracker mirrors (MLflow, W&B) replayed from the spool: every step once, whatever the tracker does.

The MLflow tests run a real `mlflow server` (SQLite store) on loopback and real training scripts
through `beacon.init` against the strict embedded AWS; the outage is the server's whole process
group SIGKILLed at a known step, and the crash is a kill point between a send and the cursor write.
The W&B test reads the offline run's own transaction log. The in-process tests drive the spool
reader and the worker directly with a fake tracker.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from beacon import kill_points
from beacon.contract import FinalState, Record
from beacon.log.spool import Spool
from beacon.settings import RunSettings, SettingsError
from beacon.sinks.mirrors import RunInfo
from beacon.sinks.mirrors.mlflow import RUN_TAG, SEQ_TAG
from beacon.sinks.mirrors.wandb import SEQ_KEY, STATE_KEY
from beacon.sinks.mirrors.worker import MIRRORS_DIR, MirrorWorker, SpoolReader

from bench.mlflow_server import MlflowServer
from bench.wandb_log import read_offline_run
from tests.conftest import WriterSession
from tests.support.job_harness import JobHarness, delivered_records
from tests.support.synth import ROOT
from tests.test_sync import aged

# A team's loop. It pauses (reads a line) after PAUSE_AT once that step is mirrored, so the test can
# stop the tracker at a known point; a second start of the same run id logs only what is left.
LOOP = """
import json, os, sys
import torch
import beacon

if os.environ.get("KILL_AT"):
    from tests.support.kill_point_job import kill_at

    kill_at(os.environ["KILL_AT"], int(os.environ["KILL_NTH"]))
STEPS, PAUSE_AT = int(sys.argv[1]), int(sys.argv[2])
run = beacon.init("lib")
(mirror,) = run.mirrors
for step in range(run.resumed_after_step + 1, STEPS):
    metrics = {"loss": torch.tensor(1.0 / (step + 1)), "lr": 0.01}
    if step == 3:
        metrics["grad_norm"] = float("nan")
    run.log(metrics, step)
    if step == PAUSE_AT:
        # The spool never seals a chunk in these runs: this proves records go out from the open chunk.
        assert mirror.wait_mirrored(step, timeout=120), "step not mirrored from the open chunk"
        print(f"paused {step}", flush=True)
        sys.stdin.readline()
report = run.finish()
mirrors = {
    name: {"sent": m.sent, "behind": m.behind, "closed": m.closed, "resumed_after": m.resumed_after,
           "failures": m.failures, "lag_s": m.lag_summary()}
    for name, m in report.mirrors.items()
}
print(json.dumps({"state": report.state.value, "mirrors": mirrors}), flush=True)
"""


# --- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture
def tracker(mlflow_server: MlflowServer) -> Iterator[MlflowServer]:
    """The session's MLflow server, running again after a test that stopped it."""
    yield mlflow_server
    if not mlflow_server.healthy():
        mlflow_server.stop()
        mlflow_server.start()


@pytest.fixture
def harness(as_writer: WriterSession, strict_aws: str, tmp_path: Path) -> JobHarness:
    return JobHarness(strict_aws, as_writer.bucket, tmp_path, as_writer.credentials)


def environment(harness: JobHarness, run: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in harness.env().items() if not k.startswith(("MLFLOW_", "WANDB_"))}
    return {
        **env,
        "BEACON_BUCKET": harness.bucket,
        "BEACON_RUN_ID": run,
        "BEACON_SPOOL_DIR": str(harness.workdir / "spool"),
        "BEACON_CHECKPOINT_DIR": str(harness.workdir / "checkpoints"),
        "BEACON_HEARTBEAT_FILE": str(harness.workdir / "heartbeat"),
        "BEACON_HEARTBEAT_INTERVAL": "0.5",
        # No chunk is sealed during a run: a mirror that waited for seals would show nothing until finish.
        "BEACON_FLUSH_INTERVAL": "600",
        "BEACON_CHUNK_RECORDS": "100000",
        # MLflow's client retries a refused connection for minutes; the mirror has its own backoff.
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
        **extra,
    }


def mlflow_env(harness: JobHarness, server: MlflowServer, run: str, **extra: str) -> dict[str, str]:
    return environment(harness, run, BEACON_MIRRORS="mlflow", BEACON_MLFLOW_TRACKING_URI=server.url, **extra)


def loop_script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(LOOP))
    return path


def run_loop(tmp_path: Path, env: dict[str, str], steps: int, pause_at: int = -1) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(loop_script(tmp_path)), str(steps), str(pause_at)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,  # a pause reads end-of-file: the loop goes straight on
        capture_output=True,
        text=True,
        timeout=300,
    )


def outcome(stdout: str) -> dict[str, Any]:
    (line,) = [line for line in stdout.splitlines() if line.startswith('{"state"')]
    return dict(json.loads(line))


class Tracked:
    """What the MLflow server holds for one Beacon run, read with MLflow's own client."""

    def __init__(self, server: MlflowServer, run: str) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(server.url)
        experiment = self.client.get_experiment_by_name("lib")
        assert experiment is not None
        (self.run,) = self.client.search_runs(
            [experiment.experiment_id], filter_string=f"tags.`{RUN_TAG}` = 'lib/{run}'", max_results=10
        )

    def steps(self, metric: str) -> list[int]:
        return sorted(m.step for m in self.client.get_metric_history(self.run.info.run_id, metric))

    def history(self, metric: str) -> dict[int, float]:
        return {m.step: m.value for m in self.client.get_metric_history(self.run.info.run_id, metric)}

    @property
    def status(self) -> str:
        return str(self.client.get_run(self.run.info.run_id).info.status)

    @property
    def seq_tag(self) -> int:
        return int(self.client.get_run(self.run.info.run_id).data.tags[SEQ_TAG])


def cursor(harness: JobHarness, run: str, tracker: str) -> dict[str, Any]:
    path = harness.workdir / "spool" / "lib" / run / MIRRORS_DIR / f"{tracker}.json"
    return dict(json.loads(path.read_text()))


# --- MLflow, for real ---------------------------------------------------------------------------------
def test_a_loop_mirrored_to_mlflow_has_every_step_once_and_the_final_state(
    harness: JobHarness, tracker: MlflowServer, as_writer: WriterSession, tmp_path: Path
) -> None:
    done = run_loop(tmp_path, mlflow_env(harness, tracker, "mirror-plain"), steps=40, pause_at=19)
    assert done.returncode == 0, done.stderr[-3000:]
    mirror = outcome(done.stdout)["mirrors"]["mlflow"]
    assert (mirror["sent"], mirror["behind"], mirror["closed"]) == (40, 0, True)
    tracked = Tracked(tracker, "mirror-plain")
    assert tracked.steps("loss") == list(range(40)), "every step once, in the tracker's own history"
    assert tracked.steps("lr") == list(range(40))
    assert tracked.history("loss")[4] == pytest.approx(0.2)
    assert math.isnan(tracked.history("grad_norm")[3]), "NaN is mirrored as NaN"
    assert tracked.status == "FINISHED"
    assert tracked.seq_tag == 39
    delivered = delivered_records(as_writer.client("s3"), as_writer.bucket, "lib", "mirror-plain")
    assert sorted(r.step for r in delivered) == list(range(40)), "S3 has every step too"


def test_a_tracker_outage_never_blocks_the_loop_and_a_later_start_mirrors_what_it_missed_once(
    harness: JobHarness, tracker: MlflowServer, as_writer: WriterSession, tmp_path: Path
) -> None:
    env = mlflow_env(harness, tracker, "mirror-outage")
    # A short budget: finish gives the mirror a quarter of it, then leaves the rest behind the cursor.
    with (tmp_path / "first.err").open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, str(loop_script(tmp_path)), "30", "9"],
            cwd=ROOT,
            env={**env, "BEACON_SHUTDOWN_BUDGET": "6"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        assert process.stdin is not None and process.stdout is not None
        for line in process.stdout:
            if line.strip() == "paused 9":  # steps 0-9 are in MLflow
                break
        tracker.stop()  # the tracker's whole process group is gone
        process.stdin.write("\n")
        process.stdin.flush()
        rest, _ = process.communicate(timeout=300)
    errors = (tmp_path / "first.err").read_text()
    assert process.returncode == 0, errors[-3000:]
    first = outcome(rest)
    assert first["state"] == "finished", "the loop stepped on to the end while the tracker was down"
    assert (first["mirrors"]["mlflow"]["behind"], first["mirrors"]["mlflow"]["closed"]) == (20, False)
    assert "mlflow mirror stopped 20 records behind" in errors
    delivered = delivered_records(as_writer.client("s3"), as_writer.bucket, "lib", "mirror-outage")
    assert sorted(r.step for r in delivered) == list(range(30)), "the outage cost S3 nothing"

    tracker.start()
    tracked = Tracked(tracker, "mirror-outage")
    assert tracked.steps("loss") == list(range(10)), "what the tracker had, it had once"
    assert tracked.status == "RUNNING", "no final state while steps are missing"
    assert cursor(harness, "mirror-outage", "mlflow")["seq"] == 9

    again = run_loop(tmp_path, env, steps=30)  # the same run id: nothing left to train, 20 to mirror
    assert again.returncode == 0, again.stderr[-3000:]
    second = outcome(again.stdout)["mirrors"]["mlflow"]
    assert (second["resumed_after"], second["sent"], second["behind"], second["closed"]) == (9, 20, 0, True)
    assert tracked.steps("loss") == list(range(30)), "caught up: every step exactly once"
    assert tracked.steps("lr") == list(range(30))
    assert tracked.status == "FINISHED"


def killed_between_send_and_cursor(tmp_path: Path, env: dict[str, str]) -> None:
    """A 30-step loop SIGKILLed at its mirror's second send, before the cursor counts it."""
    killed = run_loop(
        tmp_path,
        # The checkout first on the path: a site-packages `tests` would shadow tests.support.
        {**env, "KILL_AT": kill_points.MIRROR_SENT_NOT_RECORDED, "KILL_NTH": "2", "PYTHONPATH": str(ROOT)},
        steps=30,
        pause_at=9,
    )
    assert killed.returncode == -9, killed.stderr[-3000:]


def test_killed_between_a_send_and_the_cursor_write_the_restart_sends_nothing_twice(
    harness: JobHarness, tracker: MlflowServer, tmp_path: Path
) -> None:
    env = mlflow_env(harness, tracker, "mirror-kill")
    killed_between_send_and_cursor(tmp_path, env)
    tracked = Tracked(tracker, "mirror-kill")
    held, recorded = tracked.seq_tag, cursor(harness, "mirror-kill", "mlflow")["seq"]
    assert held > recorded, "killed inside the window: MLflow holds a batch the cursor does not count"
    assert tracked.steps("loss") == list(range(held + 1))

    again = run_loop(tmp_path, env, steps=30)
    assert again.returncode == 0, again.stderr[-3000:]
    mirror = outcome(again.stdout)["mirrors"]["mlflow"]
    assert mirror["resumed_after"] == held, "the restart asked MLflow what it holds"
    assert mirror["sent"] == 29 - held, "and sent only what MLflow did not hold"
    assert tracked.steps("loss") == list(range(30)), "every step exactly once"
    assert tracked.status == "FINISHED"


def test_beacon_sync_brings_a_killed_jobs_tracker_up_to_its_spool_once_and_closes_it_failed(
    harness: JobHarness, tracker: MlflowServer, as_writer: WriterSession, tmp_path: Path
) -> None:
    """SIGKILL between a send and its cursor write leaves a stranded spool: records only on the volume (no chunk
    sealed yet), MLflow one batch ahead of the cursor, no final state. `python -m beacon.sync` pushes the spool to S3
    and replays the rest to MLflow from what MLflow says it holds: every durable step once in both, and the run
    `FAILED` (it ended without a final state), where trackers leave a killed run RUNNING. A second sync sends
    nothing."""
    env = mlflow_env(harness, tracker, "mirror-stranded")
    killed_between_send_and_cursor(tmp_path, env)
    tracked = Tracked(tracker, "mirror-stranded")
    assert tracked.status == "RUNNING", "killed: the tracker's own run says it still runs"
    directory = aged(harness.workdir / "spool" / "lib" / "mirror-stranded")

    def sync(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "beacon.sync", str(directory), *extra],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    first = sync()
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    assert "mlflow: " in first.stdout and "final state failed" in first.stdout, first.stdout
    delivered = delivered_records(as_writer.client("s3"), as_writer.bucket, "lib", "mirror-stranded")
    durable = sorted(r.step for r in delivered)
    assert durable == list(range(len(durable))) and len(durable) >= 10, "the spool's durable steps, once, in S3"
    assert tracked.steps("loss") == durable, "every durable step once in MLflow too"
    assert tracked.status == "FAILED"
    aged(directory)  # the first sync wrote it: a second one waits as for a job
    again = sync()
    assert again.returncode == 0 and "mlflow: 0 record(s) mirrored, 0 behind" in again.stdout, again.stdout
    assert tracked.steps("loss") == durable


def test_beacon_sync_names_a_trackers_missing_setting_in_one_line(harness: JobHarness, tmp_path: Path) -> None:
    directory = tmp_path / "spool" / "lib" / "no-uri"
    (directory / MIRRORS_DIR).mkdir(parents=True)
    (directory / MIRRORS_DIR / "mlflow.json").write_text('{"seq": 4, "final_state": null}')
    env = {k: v for k, v in environment(harness, "no-uri").items() if k != "BEACON_MLFLOW_TRACKING_URI"}
    done = subprocess.run(
        [sys.executable, "-m", "beacon.sync", str(directory)], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("python -m beacon.sync: error: ") and "BEACON_MLFLOW_TRACKING_URI" in line, line


RESUMING_LOOP = """
import sys
import torch
import beacon

run = beacon.init("lib")
for step in range(run.resume_step, int(sys.argv[1])):
    run.log({"loss": 1.0 / (step + 1) + run.attempt}, step)  # each attempt's values told apart
    if step == 9:
        run.checkpoint({"w": torch.zeros(1)}, step)
run.finish()
"""


def test_a_restart_that_goes_back_to_its_checkpoint_is_sent_beside_the_earlier_attempt_and_named_superseded(
    harness: JobHarness, tracker: MlflowServer, tmp_path: Path
) -> None:
    """Attempt 0 logs steps 0-14 and checkpoints at 9; a second start of the run resumes at 10 and logs 10-24 as
    attempt 1, so attempt 0's 10-14 are superseded. Neither tracker can take points back: MLflow keeps both values
    at 10-14, W&B goes on at its next step with `beacon_step`; both runs name the superseded range, and hold
    every record once."""
    script = tmp_path / "resuming.py"
    script.write_text(RESUMING_LOOP)
    env = environment(harness, "mirror-resume", BEACON_MIRRORS="mlflow,wandb", BEACON_MLFLOW_TRACKING_URI=tracker.url,
                      BEACON_WANDB_MODE="offline")  # fmt: skip
    said: list[str] = []  # each process's own account, shown if the trackers disagree with it
    for steps in (15, 25):
        done = subprocess.run([sys.executable, str(script), str(steps)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        said.append(f"--- process {len(said)}:\n" + "\n".join(
            line for line in done.stderr.splitlines() if "beacon" in line and "progress" not in line
        )[-3000:])  # fmt: skip

    tracked = Tracked(tracker, "mirror-resume")
    points = tracked.client.get_metric_history(tracked.run.info.run_id, "loss")
    by_step: dict[int, list[float]] = {}
    for point in points:
        by_step.setdefault(point.step, []).append(round(point.value - 1.0 / (point.step + 1)))
    assert {step: sorted(attempts) for step, attempts in by_step.items()} == {
        **{step: [0] for step in range(10)},
        **{step: [0, 1] for step in range(10, 15)},
        **{step: [1] for step in range(15, 25)},
    }, "every record once; at 10-14 attempt 0's beside attempt 1's\n" + "\n".join(said)
    tags = tracked.client.get_run(tracked.run.info.run_id).data.tags
    assert tags["beacon.superseded.attempt-00000"] == "10-14" and tags["beacon.last"] == "1:24"
    assert tracked.status == "FINISHED"

    mirrors = harness.workdir / "spool" / "lib" / "mirror-resume" / MIRRORS_DIR
    rows = [
        row
        for log in sorted(mirrors.glob("wandb/offline-run-*/run-lib.mirror-resume.wandb"))
        for row in read_offline_run(log).history
        if "loss" in row
    ]
    assert sorted((row["beacon_attempt"], row["beacon_step"]) for row in rows) == [
        *((0, step) for step in range(15)),
        *((1, step) for step in range(10, 25)),
    ], "every record once, each with its own step and attempt"
    second = read_offline_run(sorted(mirrors.glob("wandb/offline-run-*/*.wandb"))[-1])
    assert second.summary["beacon_superseded"] == {"attempt-00000": "10-14"}, second.summary
    assert second.summary["beacon_last"] == [1, 24] and second.summary[STATE_KEY] == "finished"


# --- W&B, offline -------------------------------------------------------------------------------------
def test_wandb_offline_run_holds_every_step_once_and_the_final_state(harness: JobHarness, tmp_path: Path) -> None:
    env = environment(harness, "mirror-wandb", BEACON_MIRRORS="wandb", BEACON_WANDB_MODE="offline")
    done = run_loop(tmp_path, env, steps=30, pause_at=9)
    assert done.returncode == 0, done.stderr[-3000:]
    mirror = outcome(done.stdout)["mirrors"]["wandb"]
    assert (mirror["sent"], mirror["behind"], mirror["closed"]) == (30, 0, True)
    mirrors = harness.workdir / "spool" / "lib" / "mirror-wandb" / MIRRORS_DIR
    (log,) = mirrors.glob("wandb/offline-run-*/run-lib.mirror-wandb.wandb")
    offline = read_offline_run(log)
    rows = [row for row in offline.history if "loss" in row]
    assert sorted(row["_step"] for row in rows) == list(range(30)), "every step once"
    assert rows[4]["loss"] == pytest.approx(0.2)
    assert math.isnan(next(row["grad_norm"] for row in rows if row["_step"] == 3))
    assert offline.summary[STATE_KEY] == "finished" and offline.summary[SEQ_KEY] == 29
    assert offline.exit_code == 0


# --- in process: the reader and the worker ----------------------------------------------------------
def records(steps: range) -> list[Record]:
    return [Record("e", "r", s, {"loss": float(s)}, 0.0) for s in steps]


def test_the_reader_takes_records_once_fsynced_and_follows_them_into_sealed_chunks_and_s3(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    in_s3: dict[int, bytes] = {}
    reader = SpoolReader(spool, in_s3.get)
    spool.append(records(range(5)))
    assert reader.read(0, 100) == [], "written but not fsync'd: not a record a mirror may send"
    spool.sync()
    assert [r.seq for r in reader.read(0, 100)] == [0, 1, 2, 3, 4], "from the open chunk"
    first = spool.seal()
    assert first is not None
    spool.append(records(range(5, 9)))
    spool.sync()
    in_s3[first.sequence] = first.body()
    spool.acknowledge(first)  # delivered: the spool deleted it
    assert [r.seq for r in reader.read(3, 100)] == [3, 4, 5, 6, 7, 8], "S3, then the open chunk"
    assert [r.seq for r in reader.read(4, 2)] == [4, 5]
    fresh = SpoolReader(spool, in_s3.get)
    assert [r.seq for r in fresh.read(2, 100)] == [2, 3, 4, 5, 6, 7, 8], "a new process finds its place"
    in_s3.clear()
    assert SpoolReader(spool, in_s3.get).read(2, 100) == [], "a record nowhere to be read is waited for"


class FlakyTracker:
    """A tracker that refuses the first `outage` sends, and says what it holds."""

    name = "fake"

    def __init__(self, outage: int, holds: int | None = None) -> None:
        self.outage = outage
        self.holds = holds
        self.sent: list[int] = []
        self.closed: FinalState | None = None
        self.threads: set[str] = set()

    def open(self, run: RunInfo) -> int | None:
        self.threads.add(threading.current_thread().name)
        return self.holds

    def send(self, batch: Sequence[Record]) -> None:
        self.threads.add(threading.current_thread().name)
        if self.outage > 0:
            self.outage -= 1
            raise ConnectionError("tracker down")
        self.sent.extend(r.seq for r in batch)

    def close(self, state: FinalState) -> None:
        self.threads.add(threading.current_thread().name)
        self.closed = state

    def held_through(self, record: Record) -> None:
        self.threads.add(threading.current_thread().name)


def worker_for(tracker: FlakyTracker, spool: Spool, tmp_path: Path, done: threading.Event) -> MirrorWorker:
    info = RunInfo("demo", "e", "r", tmp_path / MIRRORS_DIR)
    return MirrorWorker(
        tracker, run=info, spool=spool, fetch=lambda _n: None, wake=threading.Event(), spool_finished=done.is_set
    )


def test_the_worker_waits_out_an_outage_and_sends_every_record_once_on_its_own_thread(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    done = threading.Event()
    tracker = FlakyTracker(outage=2)
    worker = worker_for(tracker, spool, tmp_path, done)
    worker.start()
    spool.append(records(range(10)))
    spool.sync()
    assert worker.wait_mirrored(9, timeout=120)
    spool.append(records(range(10, 15)))
    spool.sync()
    done.set()
    worker.finishing(FinalState.PREEMPTED)
    report = worker.join(timeout=120)
    assert tracker.sent == list(range(15)), "each record once, in order, after the outage"
    assert (report.failures, report.behind, report.closed, tracker.closed) == (2, 0, True, FinalState.PREEMPTED)
    assert tracker.threads == {"beacon-mirror-fake"}, "no tracker call on any other thread"
    assert json.loads((tmp_path / MIRRORS_DIR / "fake.json").read_text()) == {"seq": 14, "final_state": "preempted"}


def test_a_tracker_ahead_of_the_cursor_is_believed_and_nothing_is_sent_twice(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append(records(range(10)))
    spool.sync()
    (tmp_path / MIRRORS_DIR).mkdir()
    (tmp_path / MIRRORS_DIR / "fake.json").write_text(json.dumps({"seq": 3}))
    done = threading.Event()
    done.set()
    tracker = FlakyTracker(outage=0, holds=6)  # the send of 4-6 landed; its cursor write did not
    worker = worker_for(tracker, spool, tmp_path, done)
    worker.start()
    worker.finishing(FinalState.FINISHED)
    report = worker.join(timeout=120)
    assert tracker.sent == [7, 8, 9]
    assert (report.resumed_after, report.sent, report.closed) == (6, 3, True)


# --- settings -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "environ", "names"),
    [
        ({}, {"BEACON_MIRRORS": "mlflow,neptune"}, "mirrors (BEACON_MIRRORS): 'neptune' is not one of"),
        ({"mirrors": "wandb,wandb"}, {}, "mirrors (BEACON_MIRRORS): names a tracker twice"),
        ({"mirrors": ["mlflow"]}, {}, "mlflow_tracking_uri (BEACON_MLFLOW_TRACKING_URI): required"),
        ({}, {"BEACON_MIRRORS": "wandb", "BEACON_WANDB_MODE": "disabled"}, "wandb_mode (BEACON_WANDB_MODE)"),
        ({"mirrors": "wandb", "telemetry": False}, {}, "mirrors (BEACON_MIRRORS): needs telemetry on"),
    ],
)
def test_an_unusable_mirror_setting_is_one_line_naming_it(
    given: dict[str, Any], environ: dict[str, str], names: str
) -> None:
    with pytest.raises(SettingsError) as raised:
        RunSettings.resolve({"BEACON_BUCKET": "b", **environ}, **given)
    assert names in str(raised.value) and "\n" not in str(raised.value)


def test_mirror_settings_come_from_the_environment_too() -> None:
    settings = RunSettings.resolve(
        {
            "BEACON_BUCKET": "b",
            "BEACON_MIRRORS": "mlflow, wandb",
            "BEACON_MLFLOW_TRACKING_URI": "http://mlflow:5000",
            "BEACON_WANDB_MODE": "offline",
        }
    )
    assert settings.mirrors == ("mlflow", "wandb")
    assert (settings.mlflow_tracking_uri, settings.wandb_mode) == ("http://mlflow:5000", "offline")
