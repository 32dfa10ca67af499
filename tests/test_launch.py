"""`beacon.launch` on SageMaker: every instance runs the same arguments, and each fills in its own rendezvous from
the resource configuration SageMaker writes on it (`/opt/ml/input/config/resourceconfig.json`).

The whole path, two stand-in instances running a team's job through `beacon run --target sagemaker --nodes 2`, is
in tests/test_run_command.py; here, what each instance makes of its file. And on any launcher: a team's own
script that `beacon.init` refuses exits with Beacon's code and one line, read last (`beacon.process.error_file`).
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from beacon import contract
from beacon.launch import LaunchError, SageMakerInstance, VolumeError, check_volumes, resolve, with_rendezvous

from tests.support.job_harness import JobHarness
from tests.support.moto_server import MotoServer
from tests.support.synth import ROOT

ARGS = [contract.SAGEMAKER_RENDEZVOUS, "--nproc-per-node=8", "train.py", "--lr", "3e-4"]


def resource_config(tmp_path: Path, current: str, hosts: list[str], **extra: str) -> dict[str, str]:
    path = tmp_path / f"{current}.json"
    path.write_text(json.dumps({"current_host": current, "hosts": hosts, **extra}))
    return {"BEACON_SAGEMAKER_RESOURCE_CONFIG": str(path)}


def test_arguments_without_the_marker_are_torchruns_as_given() -> None:
    environ: dict[str, str] = {}
    assert with_rendezvous(["--standalone", "train.py"], environ) == ["--standalone", "train.py"] and environ == {}


def test_one_instance_runs_standalone_and_names_its_host_and_instance_type_for_the_ranks(tmp_path: Path) -> None:
    environ = resource_config(tmp_path, "algo-1", ["algo-1"], current_instance_type="ml.g5.48xlarge")
    assert with_rendezvous(ARGS, environ) == ["--standalone", *ARGS[1:]]
    assert environ["BEACON_NODE_NAME"] == "algo-1" and environ["BEACON_INSTANCE_TYPE"] == "ml.g5.48xlarge"
    assert "NCCL_SOCKET_IFNAME" not in environ, "one instance: no traffic between instances"


def test_each_of_two_instances_takes_its_node_rank_and_node_0_as_master(tmp_path: Path) -> None:
    hosts = ["algo-2", "algo-1"]  # as written; SageMaker sorts them, and so does every instance
    ranks = {}
    for current in ("algo-1", "algo-2"):
        environ = resource_config(tmp_path, current, hosts, network_interface_name="eth1")
        environ |= {"BEACON_RENDEZVOUS_HOST": "127.0.0.1", "BEACON_RENDEZVOUS_PORT": "29777"}
        args = with_rendezvous(ARGS, environ)
        assert args[4:] == ARGS[1:], "the rest of torchrun's arguments and the team's command, unchanged"
        ranks[current] = args[:4]
        # nccl and gloo between instances go over the interface SageMaker names; the ranks say where they ran.
        assert environ["NCCL_SOCKET_IFNAME"] == environ["GLOO_SOCKET_IFNAME"] == "eth1"
        assert environ["BEACON_NODE_NAME"] == current
    assert ranks["algo-1"] == ["--nnodes=2", "--node-rank=0", "--master-addr=127.0.0.1", "--master-port=29777"]
    assert ranks["algo-2"] == ["--nnodes=2", "--node-rank=1", "--master-addr=127.0.0.1", "--master-port=29777"]
    # Without the stand-in's override: node 0 is the first host, at the port the EKS Job's Service opens too.
    instance = SageMakerInstance(hosts=("algo-1", "algo-2"), current="algo-2", instance_type="", interface="")
    assert instance.rendezvous(host=None, port=contract.RENDEZVOUS_PORT) == [
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=algo-1",
        f"--master-port={contract.RENDEZVOUS_PORT}",
    ]


def test_the_teams_own_interface_setting_wins(tmp_path: Path) -> None:
    environ = resource_config(tmp_path, "algo-1", ["algo-1", "algo-2"], network_interface_name="eth1")
    environ |= {"BEACON_RENDEZVOUS_HOST": "127.0.0.1", "NCCL_SOCKET_IFNAME": "^lo,docker"}
    with_rendezvous(ARGS, environ)
    assert environ["NCCL_SOCKET_IFNAME"] == "^lo,docker" and environ["GLOO_SOCKET_IFNAME"] == "eth1"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "resourceconfig.json not found; the argument is for SageMaker training jobs"),
        ("{not json", "no hosts and current_host"),
        (json.dumps({"hosts": ["algo-1"]}), "no hosts and current_host ('current_host')"),
        (json.dumps({"current_host": "algo-3", "hosts": ["algo-1"]}), "current_host 'algo-3' is not in ('algo-1',)"),
    ],
)
def test_a_missing_or_bad_resource_configuration_is_one_line_naming_the_file(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "resourceconfig.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(LaunchError, match=rf"^{contract.SAGEMAKER_RENDEZVOUS}: {path}") as raised:
        with_rendezvous(ARGS, {"BEACON_SAGEMAKER_RESOURCE_CONFIG": str(path)})
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_node_0_that_never_resolves_is_named_after_the_wait() -> None:
    with pytest.raises(LaunchError, match=r"node 0's host 'algo-1\.invalid' did not resolve within 0 s"):
        resolve("algo-1.invalid", within_s=0.0, every_s=0.0)


def test_the_launcher_exits_2_with_one_line_before_torchrun_when_the_configuration_is_missing(tmp_path: Path) -> None:
    """Exit 2: the podFailurePolicy and SageMaker's failure reason see bad input, which no retry fixes."""
    env = {**os.environ, "BEACON_SAGEMAKER_RESOURCE_CONFIG": str(tmp_path / "absent.json")}
    done = subprocess.run(
        [sys.executable, "-m", "beacon.launch", *ARGS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"beacon.launch: {contract.SAGEMAKER_RENDEZVOUS}: {tmp_path / 'absent.json'} not found; "
        "the argument is for SageMaker training jobs"
    ]


def test_a_volume_mounted_read_only_is_named_so_before_torchrun_not_as_an_ownership_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27, finding 7: the launcher checks the volumes first, and said "fix the volume's ownership" for a
    read-only mount; it now gives preflight's one advice."""

    def read_only(self: Path, data: bytes) -> int:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "write_bytes", read_only)
    with pytest.raises(VolumeError) as raised:
        check_volumes({"BEACON_SPOOL_DIR": str(tmp_path / "spool")}, on_sagemaker=False)
    message = str(raised.value)
    assert message == (
        f"BEACON_SPOOL_DIR: {tmp_path / 'spool'} is on a volume mounted read-only (Read-only file system): "
        "mount it read-write (the pod's volumeMount without readOnly, a ReadWriteMany claim)"
    )


def test_the_directories_the_ranks_write_are_made_and_one_that_cannot_be_is_named_before_torchrun(
    tmp_path: Path,
) -> None:
    environ = {"BEACON_SPOOL_DIR": str(tmp_path / "volume" / "spool"), "BEACON_CHECKPOINT_DIR": str(tmp_path / "c")}
    check_volumes(environ, on_sagemaker=False)
    assert (tmp_path / "volume" / "spool").is_dir() and (tmp_path / "c").is_dir()
    (tmp_path / "not-a-directory").write_text("")
    environ["BEACON_CHECKPOINT_DIR"] = str(tmp_path / "not-a-directory" / "checkpoints")
    with pytest.raises(VolumeError) as raised:
        check_volumes(environ, on_sagemaker=False)
    message = str(raised.value)
    assert message.startswith(f"BEACON_CHECKPOINT_DIR: {tmp_path}/not-a-directory/checkpoints is not writable as uid")
    assert "EFS access point" in message and "\n" not in message
    done = subprocess.run(
        [sys.executable, "-m", "beacon.launch", "--standalone", "--nproc-per-node=1", "-m", "smoke_job.train"],
        cwd=ROOT, env={**os.environ, **environ}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 3 and done.stderr.strip() == f"beacon.launch: {message}", done.stderr[-2000:]


# --- a team's own script that beacon.init refuses ------------------------------------------------------------
REFUSED_LOOP = """
import beacon

run = beacon.init("lib")  # the bucket is not there: a failed preflight, on every rank
"""


def refused_by_preflight(
    tmp_path: Path, moto_server: MotoServer, launcher: list[str]
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(REFUSED_LOOP)
    credentials = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    env = {
        **JobHarness(moto_server.url, "no-such-bucket", tmp_path, credentials).env(),
        "BEACON_BUCKET": "no-such-bucket", "BEACON_RUN_ID": "refused", "BEACON_ALARMS": "false",
        "BEACON_SPOOL_DIR": str(tmp_path / "spool"), "BEACON_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "BEACON_HEARTBEAT_FILE": str(tmp_path / "heartbeat"),
    }  # fmt: skip
    return subprocess.run(
        [*launcher, "--standalone", "--nproc-per-node=2", str(script)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_teams_failed_preflight_exits_3_with_beacons_line_last(tmp_path: Path, moto_server: MotoServer) -> None:
    """torchrun says 1 for every failed worker, and its dump runs to 65-92 lines: the rank's error file carries
    Beacon's one line and code, so the Job fails at once (no retry fixes a preflight) and the line is read last."""
    done = refused_by_preflight(tmp_path, moto_server, [sys.executable, "-m", "beacon.launch"])
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == contract.EXIT_PREFLIGHT, done.stderr[-3000:]
    # every rank raises rank 0's preflight failure: torchrun's first failure is whichever wrote its file first
    assert re.match(r"beacon\.launch: rank [01]: PreflightError: s3:PutObject s3://no-such-bucket/", last), last
    assert "no such bucket; check --bucket/BEACON_BUCKET" in last and last.endswith(" s)"), last


def test_under_plain_torchrun_the_summary_shows_beacons_line_not_a_hint(
    tmp_path: Path, moto_server: MotoServer
) -> None:
    done = refused_by_preflight(tmp_path, moto_server, [sys.executable, "-m", "torch.distributed.run"])
    assert done.returncode == 1, "torchrun's own code; beacon.launch is what keeps Beacon's"
    summary = done.stderr.split("Failures:", 1)[-1] if "Failures:" in done.stderr else done.stderr
    assert "traceback : beacon: PreflightError: s3:PutObject" in summary, done.stderr[-3000:]
    assert "To enable traceback see" not in done.stderr.split("Root Cause", 1)[-1]


def test_a_teams_record_decorator_keeps_beacons_code(tmp_path: Path) -> None:
    """torchelastic's `@record` writes the error file itself ("<type>: <message>" and the traceback): the
    launcher still reads Beacon's error and code from it; a team's own error is the team's."""
    from beacon.process.error_file import failure_of

    line = "PreflightError: spool dir /artifacts/spool: the volume is mounted read-only (Read-only file system)"
    recorded = {"message": {"message": line, "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1"}}}
    assert failure_of(recorded) == (contract.EXIT_PREFLIGHT, line)
    settings = {"message": {"message": "beacon.settings.SettingsError: resume: must be one of auto, never"}}
    assert failure_of(settings) == (contract.EXIT_BAD_INPUT, settings["message"]["message"])
    assert failure_of({"message": {"message": "RuntimeError: CUDA out of memory", "extraInfo": {}}}) is None
    assert failure_of({"message": "", "timestamp": 0}) is None and failure_of({}) is None
