"""`beacon local`: the whole flow on an embedded AWS, with no account. What `make demo` runs.

1. synthesize the demo team (or reuse a fresh cdk.out), 2. start moto in its own process and
provision from the templates what the job touches, then enforce IAM, 3. run the smoke job with
torchrun (2 ranks, CPU) as the writer, 4. verify it like `beacon smoke` and run the alarm evaluator
on its recorded metrics, then `beacon doctor`, 5. show three classic failures and the doctor's verdicts,
6. write `.beacon/demo/report.json` and a PNG.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from beacon import contract
from beacon.contract.preflight import reported_seconds

from beacon_ops.doctor.after_run import verify_and_diagnose
from beacon_ops.doctor.diagnosis import Diagnosis, DoctorInputs, diagnose
from beacon_ops.evidence.alarms import AlarmSet, alarm_set_for_run
from beacon_ops.evidence.reading import MetricsReadOnce
from beacon_ops.evidence.verify import Expected, Verification, recorded_samples
from beacon_ops.local.moto import REGION
from beacon_ops.local.plot import render_png
from beacon_ops.local.processes import end_process_tree
from beacon_ops.local.sandbox import Sandbox, job_args, job_command, open_sandbox
from beacon_ops.templates import Template, load_templates
from config import names

ROOT = Path(__file__).resolve().parents[2]
TEAM = "demo"
EXPERIMENT = "smoke"
BUCKET = "beacon-demo-artifacts"
SOURCES = ("app.py", "cdk.json", "config", "stacks", "beacon_constructs", "workloads", "runtime")
DEMO_HEARTBEAT_S = 1.0  # shortened so the demo's scenarios resolve in seconds; the output says so


@dataclass
class Scenario:
    name: str
    injected: str
    verdict: str
    seconds: float
    detail: str


@dataclass
class LocalReport:
    steps: int
    ranks: int
    run: str
    verification: Verification
    doctor: Diagnosis
    scenarios: list[Scenario] = field(default_factory=list)
    wall_seconds: float = 0.0
    heartbeat_interval_s: float = DEMO_HEARTBEAT_S
    picture: str = ""

    def as_dict(self) -> dict[str, Any]:
        v = self.verification
        return {
            "steps": self.steps,
            "ranks": self.ranks,
            "run": self.run,
            "records_written": self.steps,
            "records_in_s3": v.records_in_s3,
            "records_lost": v.records_lost,
            "records_duplicated": v.records_duplicated,
            "writer_ranks": v.writer_ranks,
            "checkpoints": v.checkpoints,
            "cloudwatch_datapoints": v.cloudwatch_datapoints,
            "alarms": v.alarms,
            "doctor": self.doctor.diagnosis,
            "scenarios": {
                s.name: {
                    "verdict": s.verdict,
                    "seconds_to_verdict": round(s.seconds, 2),
                    "injected": s.injected,
                    "detail": s.detail,
                }
                for s in self.scenarios
            },
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "wall_seconds": round(self.wall_seconds, 1),
            "picture": self.picture,
            "verification": v.as_dict(),
        }


def newest_source_mtime(root: Path = ROOT) -> float:
    newest = 0.0
    for name in SOURCES:
        path = root / name
        files = (
            [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        )
        newest = max([newest, *(f.stat().st_mtime for f in files)])
    return newest


def synthesize(outdir: Path, log: Callable[[str], None]) -> dict[str, Template]:
    outdir.mkdir(parents=True, exist_ok=True)
    # Two `beacon local`s at once (two terminals, two test workers) synthesize once, not into each other
    with (outdir / ".synth.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest = outdir / "manifest.json"
        if manifest.exists() and manifest.stat().st_mtime > newest_source_mtime():
            log(f"reusing fresh templates in {outdir}")
        else:
            log("synthesizing the demo team's stacks (cdk-nag on)")
            env = {**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
            done = subprocess.run(
                ["npx", "--no-install", "cdk", "synth", "--quiet", "-c", f"team={TEAM}", "-o", str(outdir)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise RuntimeError(f"cdk synth failed: {done.stderr.strip().splitlines()[-1:]}")
        return load_templates(outdir)


def demo_job_command(sandbox: Sandbox, run: str, *extra: str, ranks: int = 1) -> list[str]:
    """The smoke job as the demo runs it: the demo team, its volume under the workdir, a short beat."""
    storage = job_args(
        bucket=BUCKET,
        spool_dir=sandbox.workdir / "volume" / "spool",
        checkpoint_dir=sandbox.workdir / "volume" / "checkpoints",
        heartbeat_file=sandbox.workdir / f"heartbeat-{run}",
        heartbeat_interval=str(DEMO_HEARTBEAT_S),
    )
    return job_command(["--team", TEAM, "--experiment", EXPERIMENT, "--run-id", run, *storage, *extra], ranks=ranks)


def doctor_inputs(
    sandbox: Sandbox, run: str, probe: dict[str, str] | None = None, *, cloudwatch: Any | None = None
) -> DoctorInputs:
    return DoctorInputs(
        team=TEAM,
        experiment=EXPERIMENT,
        run=run,
        bucket=BUCKET,
        region=REGION,
        s3=sandbox.client("s3", sandbox.reader),
        cloudwatch=cloudwatch or sandbox.client("cloudwatch", sandbox.reader),
        probe_s3=sandbox.client("s3", probe or sandbox.credentials),
    )


def doctor(sandbox: Sandbox, run: str, probe: dict[str, str] | None = None) -> Diagnosis:
    return diagnose(doctor_inputs(sandbox, run, probe))


def start_smoke(sandbox: Sandbox, run: str, steps: int, ranks: int) -> subprocess.Popen[bytes]:
    """The paced smoke job, in the background: the scenarios run meanwhile. Output goes to a file
    (a full pipe would block the job)."""
    pace = f"{contract.smoke_min_duration_s(DEMO_HEARTBEAT_S):g}"  # long enough for the run alarms to arm
    command = demo_job_command(
        sandbox,
        run,
        *("--steps", str(steps), "--workers", "1", "--checkpoint-interval", "100", "--min-duration", pace),
        ranks=ranks,
    )
    with (sandbox.workdir / "smoke-job.log").open("wb") as output:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=sandbox.job_env(sandbox.credentials),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # torchrun and its workers end together, by process group
        )


def finish_smoke(sandbox: Sandbox, job: subprocess.Popen[bytes]) -> None:
    try:
        code = job.wait(timeout=600)
    except subprocess.TimeoutExpired:
        end_process_tree(job.pid)
        code = job.wait()
    if code != 0:
        tail = (sandbox.workdir / "smoke-job.log").read_text(errors="replace").strip()[-800:]
        raise RuntimeError(f"the smoke job failed ({code}): {tail}")


def preflight_time(stderr: str, wall_seconds: float) -> float:
    """The job's own preflight time: on a busy machine, starting Python and importing torch
    take longer than the 20 s preflight budget that the verdict is held to."""
    reported = reported_seconds(stderr)
    return wall_seconds if reported is None else reported


def scenario_permission(sandbox: Sandbox) -> Scenario:
    run = "demo-denied"
    denied = sandbox.aws.user_without_rights("beacon-demo-no-rights")
    started = time.monotonic()
    done = subprocess.run(
        demo_job_command(sandbox, run, "--steps", "5"),
        cwd=ROOT,
        env=sandbox.job_env(denied),
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = preflight_time(done.stderr, time.monotonic() - started)
    line = next((x for x in done.stderr.splitlines() if x.startswith("beacon preflight:")), done.stderr[-200:])
    verdict = doctor(sandbox, run, probe=denied).diagnosis
    return Scenario(
        "permission", "a writer without s3:PutObject", verdict, seconds, f"preflight exit {done.returncode}: {line}"
    )


def scenario_tmpfs(sandbox: Sandbox) -> Scenario:
    run = "demo-tmpfs"
    spool = Path("/dev/shm") / f"beacon-demo-{os.getpid()}"
    started = time.monotonic()
    done = subprocess.run(
        [*demo_job_command(sandbox, run, "--steps", "5"), "--spool-dir", str(spool)],
        cwd=ROOT,
        env=sandbox.job_env(sandbox.credentials),
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = preflight_time(done.stderr, time.monotonic() - started)
    line = next((x for x in done.stderr.splitlines() if x.startswith("beacon preflight:")), done.stderr[-200:])
    refused = done.returncode == 3 and "tmpfs" in line
    return Scenario(
        "tmpfs-spool",
        f"spool dir on tmpfs ({spool})",
        "refused" if refused else "accepted",
        seconds,
        f"preflight exit {done.returncode}: {line}",
    )


def scenario_frozen(sandbox: Sandbox, monitoring: Template) -> tuple[Scenario, Scenario]:
    """SIGSTOP a running job; time the doctor's verdict, and the synthesized silent alarm's."""
    run = "demo-frozen"
    process = subprocess.Popen(
        demo_job_command(sandbox, run, "--steps", "100000", "--step-sleep", "0.05", "--workers", "0"),
        cwd=ROOT,
        env=sandbox.job_env(sandbox.credentials),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and doctor(sandbox, run).diagnosis != "healthy":
            time.sleep(0.5)
        os.killpg(process.pid, signal.SIGSTOP)
        frozen_at = time.time()
        started = time.monotonic()
        verdict = "healthy"
        while time.monotonic() - started < contract.SILENT_BUDGET_S and verdict != "silent":
            time.sleep(0.5)
            verdict = doctor(sandbox, run).diagnosis
        doctor_seconds = time.monotonic() - started
        # No datapoint can arrive from a stopped process: the alarm's verdict over the recorded data
        # at each later evaluation is what CloudWatch would say then.
        alarms = alarm_set_for_run(monitoring, EXPERIMENT, run)
        samples = recorded_samples(sandbox.client("cloudwatch", sandbox.reader), alarms)
        silent = contract.run_alarm_name(TEAM, EXPERIMENT, run, contract.RunAlarm.SILENT)
        beats = samples[next(k for k in samples if k[1] == contract.HEARTBEAT.name)]
        armed = contract.run_alarms_arm_at(beats[0][0]) if beats else frozen_at
        alarm_at = alarms.first_alarm(silent, samples, max(armed, frozen_at - 1), frozen_at + 600)
    finally:
        end_process_tree(process.pid)  # SIGKILL is delivered even to a stopped process
        process.wait(timeout=30)
    alarm_seconds = (alarm_at - frozen_at) if alarm_at is not None else float("inf")
    interval = f"heartbeat every {DEMO_HEARTBEAT_S:g} s (shortened for the demo)"
    return (
        Scenario(
            "frozen-doctor",
            "SIGSTOP of a running job",
            verdict,
            doctor_seconds,
            f"doctor: silent after {3:d} missed beats, {interval}",
        ),
        Scenario(
            "frozen-alarm",
            "SIGSTOP of a running job",
            "ALARM" if alarm_at else "OK",
            alarm_seconds,
            f"synthesized alarm {silent}: 30 s x 3, missing = breaching",
        ),
    )


def run_local(workdir: Path, *, steps: int = 200, ranks: int = 2, log: Callable[[str], None] = print) -> LocalReport:
    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    templates = synthesize(ROOT / "cdk.out", log)
    monitoring = templates[names.stack_name(TEAM, "monitoring")]
    log("starting the embedded AWS (moto, own process) and provisioning from the templates")
    sandbox = open_sandbox(templates, TEAM, bucket=BUCKET, workdir=workdir)
    try:
        run = f"demo-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
        log(f"running the smoke job: torchrun, {ranks} ranks on CPU, {steps} steps, as the writer (IAM enforced)")
        job = start_smoke(sandbox, run, steps, ranks)
        try:
            log("meanwhile, the scenarios: a writer without permission, a frozen job, a spool on tmpfs")
            scenarios = [scenario_permission(sandbox), *scenario_frozen(sandbox, monitoring), scenario_tmpfs(sandbox)]
        except BaseException:
            end_process_tree(job.pid)  # the demo leaves no process behind, even when it fails
            job.wait()
            raise
        log("waiting for the smoke job (paced so its run alarms arm)")
        finish_smoke(sandbox, job)
        log("verifying what reached S3 and CloudWatch, and evaluating the synthesized alarms")
        alarms: AlarmSet = alarm_set_for_run(monitoring, EXPERIMENT, run)
        metrics = MetricsReadOnce(sandbox.client("cloudwatch", sandbox.reader))  # verification, doctor, plot
        verdict = verify_and_diagnose(doctor_inputs(sandbox, run, cloudwatch=metrics), expected=Expected.exactly(steps),
                                      alarms=alarms)  # fmt: skip
        if verdict.unreadable:
            raise RuntimeError(verdict.unreadable)
        assert verdict.evidence is not None and verdict.verification is not None and verdict.diagnosis is not None
        evidence, verification, diagnosis = verdict.evidence, verdict.verification, verdict.diagnosis
        run_dims = contract.run_dimensions(TEAM, EXPERIMENT, run)
        samples = recorded_samples(metrics, alarms, (contract.PROGRESS_AGE, run_dims, "Maximum"))
        picture = render_png(
            workdir / "report.png",
            evidence.records,
            next(v for k, v in samples.items() if k[1] == contract.HEARTBEAT.name),
            next(v for k, v in samples.items() if k[1] == contract.PROGRESS_AGE.name),
        )
    finally:
        sandbox.aws.stop()
    report = LocalReport(steps, ranks, run, verification, diagnosis, scenarios, time.monotonic() - started)
    report.picture = str(picture)
    (workdir / "report.json").write_text(json.dumps(report.as_dict(), indent=2, default=str))
    return report
