"""`beacon local -- <command>`: a team's own command (`python train.py`, `torchrun ... train.py`, a Lightning or
Hugging Face script) on the embedded AWS, as the smoke job runs in `make demo`: no account needed.

The command runs in the caller's directory as the demo team's writer (IAM enforced, provisioned from the
synthesized templates), with the `BEACON_*` environment a Job sets (team, bucket, experiment, run, a volume of its
own under the work directory) and the team's run alarms. Afterwards: what reached S3 and CloudWatch (every
record once, per attempt), the alarms evaluated on the recorded metrics, and the doctor, as for the smoke job.
Ctrl-C stops the command (SIGINT, then its drain; a second Ctrl-C at once) and the embedded AWS. A `report.json`
in the work directory holds what was found.

`--keep` leaves the embedded AWS running (its address and the identities, in `embedded-aws.json` in the work
directory) and prints the lines that reach it: `beacon doctor --local`, `beacon tensorboard --local`, `python -m
beacon.sync`. The next
`beacon local` in that work directory uses it, so a command run again with the same run id resumes, as a
restarted Job would, from what S3 and the volume hold.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from beacon_ops.doctor.after_run import verify_and_diagnose
from beacon_ops.doctor.diagnosis import Diagnosis, DoctorInputs
from beacon_ops.evidence.alarms import alarm_set_for_run
from beacon_ops.evidence.reading import MetricsReadOnce
from beacon_ops.evidence.verify import Expected, Verification
from beacon_ops.local.demo import BUCKET, DEMO_HEARTBEAT_S, ROOT, TEAM, synthesize
from beacon_ops.local.moto import REGION, EmbeddedAws
from beacon_ops.local.processes import end_process_tree
from beacon_ops.local.sandbox import aws_env, open_sandbox
from beacon_ops.templates import Template
from config import names

DRAIN_S = 60.0  # after Ctrl-C, what a Job's shutdown budget gives the command to drain
KEPT = "embedded-aws.json"


@dataclass
class LocalAws:
    """The embedded AWS a command runs against, provisioned as the demo team: where it is and who acts in it
    (the writer, as the job; the reader, as the doctor). Saved in the work directory while it is kept."""

    url: str
    pid: int
    bucket: str
    writer: dict[str, str]
    reader: dict[str, str]
    workdir: Path
    runs: dict[str, str] = field(default_factory=dict)  # each run of a command here, and its experiment

    def client(self, service: str, credentials: dict[str, str] | None = None) -> Any:
        return EmbeddedAws(self.url, lambda: None).client(service, **(credentials or self.writer))

    def env(self, credentials: dict[str, str]) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BEACON_"))}
        return {**base, **aws_env(endpoint=self.url, region=REGION, credentials=credentials)}

    def save(self) -> None:
        state = {"url": self.url, "pid": self.pid, "bucket": self.bucket, "writer": self.writer, "reader": self.reader,
                 "runs": self.runs}  # fmt: skip
        (self.workdir / KEPT).write_text(json.dumps(state, indent=2))

    def stop(self, *, grace_s: float = 10) -> None:
        """SIGTERM, then SIGKILL after `grace_s`; returns once the process is gone."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            while _alive(self.pid) and time.monotonic() < deadline + grace_s:
                time.sleep(0.05)
        (self.workdir / KEPT).unlink(missing_ok=True)

    @classmethod
    def kept(cls, workdir: Path) -> LocalAws | None:
        """The one `--keep` left in `workdir`, if it still answers."""
        try:
            state = json.loads((workdir / KEPT).read_text())
            aws = cls(state["url"], int(state["pid"]), state["bucket"], state["writer"], state["reader"], workdir,
                      dict(state.get("runs") or {}))  # fmt: skip
            # the process is still the embedded AWS (a pid is reused after a reboot; 0 would be a process group)
            if aws.pid <= 1 or b"beacon_ops.local.moto" not in Path(f"/proc/{aws.pid}/cmdline").read_bytes():
                return None
            address = urlparse(aws.url)
            socket.create_connection((address.hostname, address.port), timeout=2).close()
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return aws


def _alive(pid: int) -> bool:
    """Whether `pid` still runs: reaped if it is this process's own child (a zombie answers signals too)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass  # another process's child: a kept one, started by an earlier `beacon local`
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # ended, waiting for a parent (or an init that does not reap) to collect it


def local_aws(workdir: Path, log: Callable[[str], None]) -> tuple[LocalAws, dict[str, Template]]:
    templates = synthesize(ROOT / "cdk.out", log)
    kept = LocalAws.kept(workdir)
    if kept is not None:
        log(f"using the embedded AWS kept at {kept.url} ({workdir / KEPT})")
        return kept, templates
    log("starting the embedded AWS (moto, own process) and provisioning the demo team from its templates")
    sandbox = open_sandbox(templates, TEAM, bucket=BUCKET, workdir=workdir)
    aws = LocalAws(sandbox.aws.url, sandbox.aws.pid, sandbox.bucket, sandbox.credentials, sandbox.reader, workdir)
    return aws, templates


@dataclass
class OwnRun:
    command: list[str]
    experiment: str
    run: str
    exit_code: int
    verification: Verification | None
    doctor: Diagnosis | None
    unreadable: str = ""

    @property
    def ok(self) -> bool:
        return (
            self.exit_code == 0
            and self.verification is not None
            and self.verification.ok
            and self.doctor is not None
            and self.doctor.healthy
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "experiment": self.experiment,
            "run": self.run,
            "exit_code": self.exit_code,
            "ok": self.ok,
            "doctor": self.doctor.diagnosis if self.doctor is not None else None,
            "headline": self.doctor.headline() if self.doctor is not None else self.unreadable,
            "verification": self.verification.as_dict() if self.verification is not None else None,
        }


def command_environment(aws: LocalAws, *, experiment: str, run: str) -> dict[str, str]:
    """What the Job sets for a team's container (`workloads.manifests`), on a volume under the work directory,
    as the writer; the demo's short heartbeat, so a stall is named in seconds."""
    volume = aws.workdir / "volume"
    return {
        **aws.env(aws.writer),
        "BEACON_TEAM": TEAM,
        "BEACON_EXPERIMENT": experiment,
        "BEACON_RUN_ID": run,
        "BEACON_BUCKET": aws.bucket,
        "BEACON_SPOOL_DIR": str(volume / "spool"),
        "BEACON_CHECKPOINT_DIR": str(volume / "checkpoints"),
        "BEACON_HEARTBEAT_INTERVAL": f"{DEMO_HEARTBEAT_S:g}",
        "BEACON_HEARTBEAT_FILE": str(aws.workdir / f"heartbeat-{run}"),
    }


def doctor_inputs(aws: LocalAws, *, experiment: str, run: str, cloudwatch: Any | None = None) -> DoctorInputs:
    """The doctor on the embedded AWS, as the reader; the writer probes the bucket, as a job would."""
    return DoctorInputs(
        team=TEAM, experiment=experiment, run=run, bucket=aws.bucket, region=REGION,
        s3=aws.client("s3", aws.reader), cloudwatch=cloudwatch or aws.client("cloudwatch", aws.reader),
        probe_s3=aws.client("s3"),
    )  # fmt: skip


def run_command(command: list[str], env: dict[str, str], *, cwd: Path) -> int:
    """The command in its own process group, its output the caller's; Ctrl-C reaches it once, as SIGINT, and it
    gets a Job's drain budget before the group is ended; a second Ctrl-C (or SIGTERM) ends the group at once."""
    job = subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True)
    try:
        try:
            return job.wait()
        except KeyboardInterrupt:
            try:
                os.killpg(job.pid, signal.SIGINT)
                return job.wait(timeout=DRAIN_S)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                end_process_tree(job.pid)
                return job.wait()
    except BaseException:  # a second Ctrl-C or a SIGTERM during the drain too: its own session keeps no terminal
        end_process_tree(job.pid)
        job.wait()
        raise


def run_own_command(
    command: list[str],
    workdir: Path,
    *,
    experiment: str,
    run: str,
    keep: bool = False,
    cwd: Path | None = None,
    log: Callable[[str], None] = print,
) -> OwnRun:
    workdir.mkdir(parents=True, exist_ok=True)
    aws, templates = local_aws(workdir, log)
    monitoring = templates[names.stack_name(TEAM, "monitoring")]
    try:
        log(f"running `{' '.join(command)}` as the team's writer (IAM enforced): experiment {experiment}, run {run}")
        code = run_command(command, command_environment(aws, experiment=experiment, run=run), cwd=cwd or Path.cwd())
        log(f"the command exited {code}; verifying what reached S3 and CloudWatch, and evaluating the alarms")
        metrics = MetricsReadOnce(aws.client("cloudwatch", aws.reader))
        verdict = verify_and_diagnose(
            doctor_inputs(aws, experiment=experiment, run=run, cloudwatch=metrics),
            expected=Expected.own_job(),
            alarms=alarm_set_for_run(monitoring, experiment, run),
        )
        result = OwnRun(command, experiment, run, code, verdict.verification, verdict.diagnosis, verdict.unreadable)
    finally:
        aws.runs[run] = experiment
        if keep:
            aws.save()
        else:
            aws.stop()
    (workdir / "report.json").write_text(json.dumps(result.as_dict(), indent=2, default=str))
    return result


def kept_lines(aws: LocalAws, *, experiment: str, run: str) -> list[str]:
    """How to reach the embedded AWS `--keep` left running."""
    spool = aws.workdir / "volume" / "spool" / experiment / run
    writer = " ".join(f"{k}={v}" for k, v in aws.env(aws.writer).items() if k.startswith("AWS_"))
    return [
        f"the embedded AWS stays up at {aws.url}; the next `beacon local --workdir {aws.workdir}` uses it",
        f"  the doctor:        beacon doctor --local --workdir {aws.workdir} --run {run}",
        f"  TensorBoard:       beacon tensorboard --local --workdir {aws.workdir} --run {run}",
        f"  a stranded spool:  {writer} BEACON_BUCKET={aws.bucket} python -m beacon.sync {spool}",
        f"  stop it:           beacon local --workdir {aws.workdir} --stop",
    ]


def new_run_id(experiment: str) -> str:
    """As `beacon run` names a run: the experiment and the time."""
    return f"{experiment}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
