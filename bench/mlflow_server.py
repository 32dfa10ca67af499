"""A real `mlflow server` on 127.0.0.1 with a SQLite store, in a process group of its own.

`stop` SIGKILLs the whole group (the CLI, its uvicorn worker) and returns once none of them is
left, so a restart on the same port and store is a tracker coming back after an outage.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

READY_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def group_members(pgid: int) -> list[int]:
    """Processes of the group that are not yet dead (a zombie is dead: its sockets are closed)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


class MlflowServer:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = directory / "server.log"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        mlflow = Path(sys.executable).with_name("mlflow")
        command = [
            str(mlflow),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--backend-store-uri",
            f"sqlite:///{self.directory / 'mlflow.db'}",
            "--artifacts-destination",
            str(self.directory / "artifacts"),
            "--workers",
            "1",
        ]
        # The job runner and its task consumers are for MLflow's GenAI jobs; a tracking test needs none.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                command, cwd=self.directory, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.healthy():
            if self._process.poll() is not None:
                raise RuntimeError(f"mlflow server exited {self._process.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mlflow server not healthy after {READY_TIMEOUT_S:.0f} s: {self.log_tail()}")
            time.sleep(0.2)  # polling a condition (health), not waiting for luck

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """SIGKILL the server's whole process group; return once no member of it is alive."""
        if self._process is None:
            return
        pgid = self._process.pid  # start_new_session: the CLI leads its own group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        self._process.wait()
        deadline = time.monotonic() + 30
        while group_members(pgid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server group {pgid} still alive: {group_members(pgid)}")
            time.sleep(0.05)
        self._process = None

    def log_tail(self, characters: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-characters:] if self.log_path.exists() else ""
