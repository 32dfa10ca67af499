"""`beacon local`, what `make demo` runs, end to end as a real subprocess: the report holds, and
nothing is left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.job_harness import wait_for
from tests.support.synth import ROOT

MARKER = "PYTEST_BEACON_DEMO_RUN"  # jobs keep it: the demo strips only AWS_* and BEACON_*


def demo_processes(workdir: Path) -> list[str]:
    """Processes this demo started: its jobs and its embedded AWS inherit the marker in their
    environment (other tests may run their own embedded AWS meanwhile)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        if f"{MARKER}={workdir}".encode() in environ:
            found.append(f"{proc.name} {args}")
    return found


def test_beacon_local_delivers_everything_once_and_shows_every_scenarios_verdict(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "beacon_ops.cli", "local", "--workdir", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, MARKER: str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["steps"], report["ranks"]) == (200, 2)
    assert report["records_written"] == report["records_in_s3"] == 200
    assert report["records_lost"] == 0 and report["records_duplicated"] == 0
    assert report["writer_ranks"] == [0]
    assert report["checkpoints"] >= 1 and report["cloudwatch_datapoints"] > 0
    assert report["doctor"] == "finished"
    assert "ALARM" not in report["alarms"].values()
    scenarios = report["scenarios"]
    assert scenarios["permission"]["verdict"] == "permission"
    assert scenarios["permission"]["seconds_to_verdict"] < 20
    assert scenarios["frozen-doctor"]["verdict"] == "silent"
    assert scenarios["frozen-alarm"]["verdict"] == "ALARM"
    assert scenarios["frozen-alarm"]["seconds_to_verdict"] <= 120
    assert scenarios["tmpfs-spool"]["verdict"] == "refused"
    assert report["wall_seconds"] > 0
    picture = Path(report["picture"])
    assert picture.is_file() and picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert demo_processes(tmp_path) == [], "the demo leaves no process running"


def test_beacon_local_stopped_with_sigterm_mid_scenario_leaves_no_process(tmp_path: Path) -> None:
    """A cancelled pipeline or a closed terminal: the demo still ends its jobs and its embedded AWS."""
    cli = subprocess.Popen(
        [sys.executable, "-m", "beacon_ops.cli", "local", "--workdir", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, MARKER: str(tmp_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        frozen_job_started = wait_for(
            lambda: any("demo-frozen" in p for p in demo_processes(tmp_path)), timeout=240, interval=0.5
        )
        assert frozen_job_started, "the demo reached its frozen-job scenario"
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=120) == 143
    finally:
        if cli.poll() is None:
            cli.kill()
    assert wait_for(lambda: demo_processes(tmp_path) == [], timeout=30), demo_processes(tmp_path)


# --- beacon local -- <command>: a team's own script ------------------------------------------------------------
OWN_DDP_SCRIPT = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
import beacon

run = beacon.init()  # the experiment and run from the environment `beacon local` sets, as a Job sets it
model = DDP(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(run.resume_step, 40):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    run.log({"loss": loss.item()}, step)
run.finish()
"""


# Run from the team's directory, this checkout's code (whichever checkout the environment's .pth names)
CHECKOUT = os.pathsep.join([str(ROOT), str(ROOT / "runtime")])


def test_a_teams_own_two_rank_ddp_script_runs_through_beacon_local_and_every_step_arrives_once(
    tmp_path: Path,
) -> None:
    """What a newcomer runs first with their own loop: no account, their command as they would type it."""
    (tmp_path / "train.py").write_text(OWN_DDP_SCRIPT)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    workdir = tmp_path / "beacon"
    done = subprocess.run(
        [sys.executable, "-m", "beacon_ops.cli", "local", "--workdir", str(workdir), "--experiment", "mine",
         "--run", "ddp-1", "--", torchrun, "--standalone", "--nproc-per-node", "2", "train.py"],
        cwd=tmp_path, env={**os.environ, MARKER: str(workdir), "PYTHONPATH": CHECKOUT},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((workdir / "report.json").read_text())
    assert (report["experiment"], report["run"], report["exit_code"]) == ("mine", "ddp-1", 0)
    verification = report["verification"]
    assert verification["records_in_s3"] == 40, "every step in S3"
    assert verification["records_lost"] == 0 and verification["records_duplicated"] == 0, "each once"
    assert verification["writer_ranks"] == [0]
    assert "Heartbeat" in verification["metrics_present"], "heartbeats in CloudWatch"
    assert report["doctor"] == "finished", report["headline"]
    assert "ALARM" not in verification["alarms"].values()
    assert demo_processes(workdir) == [], "nothing left running"


KILLED_ONCE_SCRIPT = """
import os, signal, time
from pathlib import Path
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
import beacon

run = beacon.init()
model = DDP(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
if (state := run.load_checkpoint()) is not None:  # what the killed attempt saved, on every rank
    model.module.load_state_dict(state["model"])
if run.world.rank == 0:
    print("resumed at step", run.resume_step, flush=True)
for step in range(run.resume_step, 40):
    loss = model(torch.randn(4, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    run.log({"loss": loss.item()}, step)
    if step == 19:
        run.checkpoint({"model": model.module.state_dict()}, step)
        time.sleep(2)  # its records fsync'd, it is the latest: what a restart resumes from
    if step == 25 and run.world.rank == 0 and not Path("killed-once").exists():
        Path("killed-once").touch()
        os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer on rank 0, the first time only
run.finish()
"""


TWO_RANKS = (str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node", "2", "train.py")
DEAF_SCRIPT = """
import signal, time
signal.signal(signal.SIGINT, lambda *_: print("asked to stop; not stopping", flush=True))
print("deaf and running", flush=True)
while True:
    time.sleep(0.1)
"""


def test_a_command_stopped_twice_is_ended_at_once_with_the_embedded_aws(tmp_path: Path) -> None:
    """The first SIGTERM (or Ctrl-C) reaches the command as SIGINT and gives it a Job's drain budget; the second
    ends its process group at once. A command that ignores SIGINT is never left running: it has a session of its
    own, so the terminal could not reach it, and the embedded AWS under it is stopped too."""
    (tmp_path / "deaf.py").write_text(DEAF_SCRIPT)
    workdir = tmp_path / "beacon"
    cli = subprocess.Popen(
        [sys.executable, "-m", "beacon_ops.cli", "local", "--workdir", str(workdir), "--", sys.executable, "deaf.py"],
        cwd=tmp_path, env={**os.environ, MARKER: str(workdir), "PYTHONPATH": CHECKOUT},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert cli.stdout is not None
        for line in cli.stdout:
            if "deaf and running" in line:
                break
        cli.send_signal(signal.SIGTERM)
        for line in cli.stdout:
            if "not stopping" in line:  # the first stop reached it as SIGINT
                break
        assert any("deaf.py" in p for p in demo_processes(workdir)), "it ignored SIGINT and runs on"
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=60) == 143
    finally:
        if cli.poll() is None:
            cli.kill()
    assert wait_for(lambda: demo_processes(workdir) == [], timeout=30), demo_processes(workdir)


def test_a_killed_command_run_again_with_its_run_id_resumes_and_each_step_is_live_once(tmp_path: Path) -> None:
    """A team's two-rank DDP script under torchrun, rank 0 SIGKILLed at step 25, then run again with its run id, the
    way a restarted Job resumes: `--keep` leaves the embedded AWS (and the volume) for the next run, the
    doctor reads the killed run on it, and the rerun takes over where S3 and the spool end."""
    (tmp_path / "train.py").write_text(KILLED_ONCE_SCRIPT)
    workdir = tmp_path / "beacon"
    env = {**os.environ, MARKER: str(workdir), "PYTHONPATH": CHECKOUT, "COLUMNS": "200"}

    def beacon(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "beacon_ops.cli", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip

    try:
        first = beacon("local", "--workdir", str(workdir), "--run", "again", "--keep", "--", *TWO_RANKS)
        assert first.returncode == 1 and "the run did not hold" in first.stderr, first.stdout[-3000:] + first.stderr
        assert json.loads((workdir / "report.json").read_text())["exit_code"] != 0, "torchrun saw rank 0 killed"
        shown = f"beacon doctor --local --workdir {workdir} --run again"  # nothing else: no team, no roles
        assert shown in first.stdout, first.stdout[-3000:]
        doctor = json.loads(beacon(*shown.split()[1:], "--json").stdout)
        assert (doctor["experiment"], doctor["run"]) == ("default", "again")
        assert not [v for v in doctor["verdicts"] if v["verdict"] == "unreadable"], doctor["verdicts"]
        assert "killed-once" in os.listdir(tmp_path) and doctor["headline"], doctor

        second = beacon("local", "--workdir", str(workdir), "--run", "again", "--keep", "--", *TWO_RANKS)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        # What --keep prints reaches the run as written: TensorBoard's files, and a sync of its spool
        shown = f"beacon tensorboard --local --workdir {workdir} --run again"
        assert shown in second.stdout, second.stdout[-3000:]
        board = beacon(*shown.split()[1:], "--no-serve", "--dir", str(tmp_path / "board"))
        assert board.returncode == 0 and board.stdout.strip() == str(tmp_path / "board"), board.stderr
        assert any("tfevents" in name for name in os.listdir(tmp_path / "board"))
        (sync_line,) = [line.split("a stranded spool:", 1)[1].split() for line in second.stdout.splitlines()
                        if "a stranded spool:" in line]  # fmt: skip
        assignments = dict(word.split("=", 1) for word in sync_line[: sync_line.index("python")])
        synced = subprocess.run([sys.executable, *sync_line[sync_line.index("python") + 1 :]], cwd=tmp_path,
                                env={**env, **assignments}, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert synced.returncode == 0, synced.stdout + synced.stderr  # every chunk already in S3: nothing to do
    finally:
        beacon("local", "--workdir", str(workdir), "--stop")
    resumed = int(second.stdout.split("resumed at step ")[1].split()[0])
    assert resumed == 20, "it resumed after the killed attempt's checkpoint"
    verification = json.loads((workdir / "report.json").read_text())["verification"]
    live = verification["records_in_s3"] - verification["records_superseded"]
    assert live == 40 and verification["records_lost"] == 0 and verification["records_duplicated"] == 0, verification
    assert json.loads((workdir / "report.json").read_text())["doctor"] == "finished"
    assert wait_for(lambda: demo_processes(workdir) == [], timeout=30), "--stop stopped the embedded AWS"
