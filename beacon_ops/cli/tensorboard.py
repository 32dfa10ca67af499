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
from typing import Annotated, Any, NoReturn

import typer
from beacon import contract
from botocore.exceptions import BotoCoreError, ClientError

from beacon_ops.aws_access import AccessError, describe_aws_error
from beacon_ops.cli.common import (
    DEFAULT_LOCAL_WORKDIR,
    Local,
    LocalWorkdir,
    ReaderBucket,
    ReaderExperiment,
    ReaderRegion,
    ReaderRoleArn,
    ReaderTeam,
    RunId,
    fail,
    kept_or_fail,
    team_reader_or_fail,
)
from beacon_ops.local.processes import stop_process

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


def serve_directory(directory: Path, port: int) -> int:
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
            stop_process(process)


def tensorboard(
    run: RunId,
    team: ReaderTeam = None,
    experiment: ReaderExperiment = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="TensorBoard's port on localhost")] = 6006,
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="where the files go (default: .beacon/tensorboard/<team>/<experiment>/<run>)"),
    ] = None,
    serve: Annotated[
        bool, typer.Option("--serve/--no-serve", help="--no-serve: download only, and print the directory")
    ] = True,
    bucket: ReaderBucket = None,
    region: ReaderRegion = None,
    reader_role_arn: ReaderRoleArn = None,
    local: Local = False,
    workdir: LocalWorkdir = DEFAULT_LOCAL_WORKDIR,
) -> None:
    """A run's TensorBoard files from S3 into a local directory, then TensorBoard on them."""
    if local:
        fetched = fetch_local(workdir, experiment=experiment, run=run, directory=directory)
        show_fetched(fetched, serve=serve, port=port)
    if team is None:
        raise fail("tensorboard", "Missing option '--team' (or --local, for a run of beacon local)")
    experiment = experiment or "smoke"
    target = directory or default_directory(team, experiment, run)
    s3, bucket, where, _ = team_reader_or_fail("tensorboard", team, region=region, bucket=bucket,
                                            reader_role_arn=reader_role_arn)  # fmt: skip
    try:
        fetched = fetch_run(s3, bucket=bucket, experiment=experiment, run=run, directory=target)
    except TensorBoardError as error:
        raise fail("tensorboard", str(error)) from None
    except (ClientError, BotoCoreError) as error:
        raise fail("tensorboard", f"cannot read {where}: {describe_aws_error(error)}") from None
    except OSError as error:
        raise fail("tensorboard", f"--dir {target}: {error.strerror or error}") from None
    show_fetched(fetched, serve=serve, port=port)


def fetch_local(workdir: Path, *, experiment: str | None, run: str, directory: Path | None) -> Fetched:
    """A run of `beacon local --keep -- <command>`, read as the reader from the embedded AWS it left running."""
    from beacon_ops.local.demo import TEAM

    kept = kept_or_fail("tensorboard", workdir)
    experiment = experiment or kept.runs.get(run, "default")  # `beacon local` remembers where each run wrote
    target = directory or default_directory(TEAM, experiment, run)
    try:
        return fetch_run(
            kept.client("s3", kept.reader), bucket=kept.bucket, experiment=experiment, run=run, directory=target
        )
    except TensorBoardError as error:
        raise fail("tensorboard", str(error)) from None
    except (ClientError, BotoCoreError) as error:
        raise fail("tensorboard", f"cannot read the embedded AWS at {kept.url}: {describe_aws_error(error)}") from None
    except OSError as error:
        raise fail("tensorboard", f"--dir {target}: {error.strerror or error}") from None


def show_fetched(fetched: Fetched, *, serve: bool, port: int) -> NoReturn:
    print(
        f"beacon tensorboard: {len(fetched.files)} files ({fetched.downloaded} new) from {fetched.source} "
        f"in {fetched.directory}",
        file=sys.stderr,
    )
    if not serve:
        print(fetched.directory)
        raise typer.Exit(0)
    print(f"beacon tensorboard: serving at http://localhost:{port}/ (Ctrl-C stops it)", file=sys.stderr)
    try:
        raise typer.Exit(serve_directory(fetched.directory, port))
    except (TensorBoardError, AccessError) as error:
        raise fail("tensorboard", str(error)) from None
