"""The container's entry point: torchrun, with the job's own exit code and its graceful stop kept.

- torchrun exits 1 whenever a worker fails, so the Job's podFailurePolicy could not tell bad input
  (2) or a failed preflight (3), which no retry fixes, from a crash worth retrying. This runs torchrun
  in this process and exits with the first failing worker's code (128 + N if signal N killed it); when that
  worker's error file holds Beacon's error (`beacon.process.error_file`: a team's own `beacon.init` that raised), with
  its code, after printing its one line last, below torchrun's dump.
- Kubernetes and SageMaker send SIGTERM to the container's first process only. torchrun's own
  handler would stop the workers and exit with an error however cleanly they drained; here SIGTERM
  is forwarded to the workers instead, torchrun waits for them as for any exit, and a worker that
  drained everything makes the container exit 0.
- On SageMaker every instance runs the same arguments, so the job's say where the rendezvous goes
  (`contract.SAGEMAKER_RENDEZVOUS`) and each instance fills in its own from the resource configuration
  SageMaker writes: the node count and this node's rank from `hosts` and `current_host`, node 0 as the
  first host, and its name and instance type for the ranks' evidence (`beacon.evidence.ranks.Placement`).
- The spool and checkpoint directories must be this user's to write before any rank starts: SageMaker creates
  /opt/ml/* itself, and an image that runs as uid 1000 can find /opt/ml/checkpoints root's. That is one line and
  exit 3 (a failed preflight, which no retry fixes), not a preflight failure inside every rank's traceback. There
  is no fallback: SageMaker syncs that directory alone, and a spool elsewhere would not survive the instance.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun

from beacon import contract
from beacon.files import READ_ONLY_FIX
from beacon.process import error_file

# torchrun handles the rest; SIGTERM is ours to forward.
SIGNALS_FOR_TORCHRUN = "SIGINT,SIGHUP,SIGQUIT"
FORWARD_EVERY_S = 1.0
# SageMaker's description of the job's instances, on every instance. The tests' stand-in instances point
# BEACON_SAGEMAKER_RESOURCE_CONFIG at their own, and BEACON_RENDEZVOUS_HOST/PORT at 127.0.0.1 and a free port.
SAGEMAKER_RESOURCE_CONFIG = "/opt/ml/input/config/resourceconfig.json"
# "Hostname information may not be immediately available" (SageMaker's guide): node 0's name is retried
# this long before torchrun, whose store would otherwise give up at the first failed lookup.
RESOLVE_FOR_S = 300.0
RESOLVE_EVERY_S = 2.0


EXIT_BAD_INPUT, EXIT_PREFLIGHT = contract.EXIT_BAD_INPUT, contract.EXIT_PREFLIGHT
# Where the ranks write, from the environment the Job or the training job sets (`beacon.settings`).
VOLUME_SETTINGS = ("BEACON_SPOOL_DIR", "BEACON_CHECKPOINT_DIR")


class LaunchError(Exception):
    """Bad launch arguments or environment: one line, exit 2 (no retry fixes it)."""


class VolumeError(Exception):
    """A directory the ranks must write is not this user's to write: one line, exit 3."""


def check_volumes(environ: MutableMapping[str, str], *, on_sagemaker: bool) -> None:
    """Each directory the ranks write (created if missing) takes a file from this user, or VolumeError names it."""
    for setting in VOLUME_SETTINGS:
        if not (value := environ.get(setting)):
            continue
        directory = Path(value)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            probe = directory / f".beacon-launch-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as error:
            raise VolumeError(_unwritable(setting, directory, error, on_sagemaker=on_sagemaker)) from None


def _unwritable(setting: str, directory: Path, error: OSError, *, on_sagemaker: bool) -> str:
    # Not an ownership question on a pod: nothing can write there. (SageMaker's /opt/ml is its own, not a mount the
    # job chooses: the advice below, for the image's user, is the one it can follow.)
    if error.errno == errno.EROFS and not on_sagemaker:
        return f"{setting}: {directory} is on a volume mounted read-only ({error.strerror}): {READ_ONLY_FIX}"
    held = next((p for p in (directory, *directory.parents) if p.exists()), directory)
    try:
        info = held.stat()
        owner = f"{held} is owned by {info.st_uid}:{info.st_gid}, mode {info.st_mode & 0o777:04o}"
    except OSError:
        owner = f"{held} cannot be read"
    who = f"uid {os.getuid()}, gid {os.getgid()}"
    if on_sagemaker:
        fix = (
            "SageMaker creates /opt/ml root's: run the image as root there (no `USER` in its Dockerfile; on EKS the "
            "Job's securityContext still runs it as the volume's uid)"
        )
    else:
        fix = "fix the volume's ownership (the EFS access point's uid/gid, the pod's fsGroup) or mount it there"
    return f"{setting}: {directory} is not writable as {who} ({error.strerror}; {owner}): {fix}"


@dataclass(frozen=True)
class SageMakerInstance:
    """This instance's part in a SageMaker training job (`resourceconfig.json`)."""

    hosts: tuple[str, ...]  # sorted as SageMaker sorts them; the same list on every instance
    current: str
    instance_type: str
    interface: str

    @classmethod
    def read(cls, path: Path) -> SageMakerInstance:
        try:
            config = json.loads(path.read_text())
            hosts, current = tuple(str(h) for h in config["hosts"]), str(config["current_host"])
        except FileNotFoundError:
            raise LaunchError(
                f"{contract.SAGEMAKER_RENDEZVOUS}: {path} not found; the argument is for SageMaker training jobs"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise LaunchError(f"{contract.SAGEMAKER_RENDEZVOUS}: {path}: no hosts and current_host ({error})") from None
        if current not in hosts:
            raise LaunchError(f"{contract.SAGEMAKER_RENDEZVOUS}: {path}: current_host {current!r} is not in {hosts}")
        return cls(
            hosts=tuple(sorted(hosts)),
            current=current,
            instance_type=str(config.get("current_instance_type", "")),
            interface=str(config.get("network_interface_name", "")),
        )

    def rendezvous(self, *, host: str | None, port: int) -> list[str]:
        """torchrun's rendezvous for this instance: standalone on one, static with node 0 as master on several."""
        if len(self.hosts) == 1:
            return ["--standalone"]
        return [
            f"--nnodes={len(self.hosts)}",
            f"--node-rank={self.hosts.index(self.current)}",
            f"--master-addr={host or self.hosts[0]}",
            f"--master-port={port}",
        ]

    def environment(self) -> dict[str, str]:
        """What the ranks inherit: where they run, and the interface nccl and gloo must use between instances."""
        found = {"BEACON_NODE_NAME": self.current, "BEACON_INSTANCE_TYPE": self.instance_type}
        if len(self.hosts) > 1 and self.interface:
            found |= {"NCCL_SOCKET_IFNAME": self.interface, "GLOO_SOCKET_IFNAME": self.interface}
        return {name: value for name, value in found.items() if value}


def resolve(host: str, *, within_s: float = RESOLVE_FOR_S, every_s: float = RESOLVE_EVERY_S) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            socket.getaddrinfo(host, None)
            return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise LaunchError(
                    f"{contract.SAGEMAKER_RENDEZVOUS}: node 0's host {host!r} did not resolve within {within_s:.0f} s "
                    f"({error})"
                ) from None
        time.sleep(every_s)


def with_rendezvous(args: list[str], environ: MutableMapping[str, str]) -> list[str]:
    """torchrun's arguments with this SageMaker instance's rendezvous in place of the marker; the ranks' placement
    and network interface go into `environ` unless it names them already. Arguments without the marker: as given."""
    if contract.SAGEMAKER_RENDEZVOUS not in args:
        return args
    instance = SageMakerInstance.read(Path(environ.get("BEACON_SAGEMAKER_RESOURCE_CONFIG", SAGEMAKER_RESOURCE_CONFIG)))
    host = environ.get("BEACON_RENDEZVOUS_HOST")
    port_text = environ.get("BEACON_RENDEZVOUS_PORT", str(contract.RENDEZVOUS_PORT))
    if not port_text.isdigit():
        raise LaunchError(f"BEACON_RENDEZVOUS_PORT: {port_text!r} is not a port number")
    rendezvous = instance.rendezvous(host=host, port=int(port_text))
    if len(instance.hosts) > 1:
        resolve(host or instance.hosts[0])
    for name, value in instance.environment().items():
        environ.setdefault(name, value)
    at = args.index(contract.SAGEMAKER_RENDEZVOUS)
    return [*args[:at], *rendezvous, *args[at + 1 :]]


def children(parent: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


class SigtermForwarder:
    """Once SIGTERM arrives, every worker gets it, including one that starts afterwards."""

    def __init__(self) -> None:
        self.received = threading.Event()
        self.signalled: set[int] = set()

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        if not self.received.is_set():
            self.received.set()
            threading.Thread(target=self._forward, daemon=True, name="sigterm-forwarder").start()

    def _forward(self) -> None:
        while True:
            for pid in children(os.getpid()):
                if pid not in self.signalled:
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except ProcessLookupError:
                        continue
                    self.signalled.add(pid)
            time.sleep(FORWARD_EVERY_S)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    on_sagemaker = contract.SAGEMAKER_RENDEZVOUS in args
    try:
        args = with_rendezvous(args, os.environ)
    except LaunchError as error:
        print(f"beacon.launch: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        check_volumes(os.environ, on_sagemaker=on_sagemaker)
    except VolumeError as error:
        print(f"beacon.launch: {error}", file=sys.stderr)
        return EXIT_PREFLIGHT
    SigtermForwarder().install()
    try:
        torchrun([f"--signals-to-handle={SIGNALS_FOR_TORCHRUN}", *args])
    except ChildFailedError as error:
        _, failure = error.get_first_failure()
        # Only an uncaught exception (exit 1) is the error its file names: a team that caught Beacon's error and
        # later died otherwise (a signal, its own exit code) leaves a stale line there. The first such failure of
        # any rank: the "first" failure may be a rank torchrun stopped (SIGTERM) just after its error file was
        # written, when another rank's exit 1 was what stopped the job
        exited = sorted((f.timestamp, r, f) for r, f in error.failures.items() if f.exitcode == 1)
        for _, failed_rank, failed in exited:
            beacons = error_file.failure_of(failed.error_file_data)
            if beacons is not None:  # Beacon's own one line, last, and its code: torchrun says 1 for every failure
                code, line = beacons
                print(f"beacon.launch: rank {failed_rank}: {line}", file=sys.stderr, flush=True)
                return code
        code = int(failure.exitcode)
        if code < 0:
            return 128 - code
        return code or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
