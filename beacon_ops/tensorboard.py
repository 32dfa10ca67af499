"""`beacon tensorboard`: a run's TensorBoard files, from S3 into a local directory, then TensorBoard on them.

The job uploads each flush as a whole, create-only event file (runtime/beacon/telemetry.py), under
``contract.tensorboard_key(experiment, run, name)``. A file once uploaded never changes, so a file
already here at its size is not fetched again: running the command again fetches only what is new.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from beacon import contract

DEFAULT_PORT = 6006


class TensorBoardError(Exception):
    """The command cannot go on; the message is one line naming what is wrong."""


@dataclass(frozen=True)
class Fetched:
    directory: Path
    source: str  # s3://bucket/prefix
    files: tuple[Path, ...]  # every file of the run, now local
    downloaded: int  # fetched this time; the rest were here already


def default_directory(team: str, experiment: str, run: str) -> Path:
    return Path(".beacon") / "tensorboard" / team / experiment / run


def _objects(s3: Any, bucket: str, prefix: str) -> Iterator[dict[str, Any]]:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        yield from page.get("Contents", [])


def fetch_run(s3: Any, *, bucket: str, experiment: str, run: str, directory: Path) -> Fetched:
    """Download every TensorBoard file of the run into ``directory`` (created if need be)."""
    prefix = contract.tensorboard_key(experiment, run, "")
    source = f"s3://{bucket}/{prefix}"
    files, downloaded = [], 0
    for listed in _objects(s3, bucket, prefix):
        name = listed["Key"].removeprefix(prefix)
        if not name or "/" in name or name in (".", ".."):
            continue  # the job writes flat file names; anything else is not one of its files
        local = directory / name
        files.append(local)
        if local.is_file() and local.stat().st_size == listed["Size"]:
            continue
        directory.mkdir(parents=True, exist_ok=True)
        # TensorBoard reads every name holding "tfevents": a file appears under its name whole, or not at all.
        partial = directory / ".beacon-download.partial"
        try:
            s3.download_file(bucket, listed["Key"], str(partial))
            partial.replace(local)
        finally:
            partial.unlink(missing_ok=True)
        downloaded += 1
    if not files:
        raise TensorBoardError(
            f"run {run!r} of experiment {experiment!r} has no TensorBoard files under {source} "
            f"(has it recorded a step? `beacon doctor --run {run} --experiment {experiment}` says why not)"
        )
    return Fetched(directory=directory, source=source, files=tuple(sorted(files)), downloaded=downloaded)


def port_is_free(port: int, host: str = "localhost") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def tensorboard_command(directory: Path, port: int) -> list[str]:
    """TensorBoard from this interpreter's environment, on localhost only (its default)."""
    return [sys.executable, "-m", "tensorboard.main", "--logdir", str(directory), "--port", str(port)]


def serve(directory: Path, port: int) -> int:
    """Run TensorBoard until it exits or this process is interrupted; never leave it behind."""
    try:
        import tensorboard  # noqa: F401  # the operator's environment has it with the runtime's extras
    except ImportError:
        raise TensorBoardError(
            "tensorboard is not installed here: `make install`, or `pip install tensorboard` (use --no-serve "
            "to download only)"
        ) from None
    if not port_is_free(port):
        raise TensorBoardError(f"--port {port} is in use on localhost; pass another --port")
    process = subprocess.Popen(tensorboard_command(directory, port))
    try:
        return process.wait()
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
