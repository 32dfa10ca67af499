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
