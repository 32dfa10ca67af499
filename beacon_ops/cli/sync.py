"""`beacon sync <spool dir>`: the runtime's `python -m beacon.sync`, for a machine that has the operator's command
(a debugging pod holding the writer's identity, `beacon local`'s sandbox). The training image has the runtime alone
and runs `python -m beacon.sync`; both are the same code, with the same options and exit codes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def sync(
    spool_dir: Annotated[Path, typer.Argument(help="<spool root>/<experiment>/<run>")],
    bucket: Annotated[str | None, typer.Option(help="artifact bucket [BEACON_BUCKET]")] = None,
    region: Annotated[str | None, typer.Option(help="AWS region [AWS_REGION]")] = None,
    mirror: Annotated[
        list[str] | None, typer.Option(help="a tracker to mirror to (repeatable) [those with a cursor in the spool]")
    ] = None,
    no_mirrors: Annotated[bool, typer.Option("--no-mirrors", help="push to S3 only")] = False,
) -> None:
    """Push a stranded spool (a dead pod's volume) to S3 and the run's tracker mirrors, idempotently.

    Exit codes: 0 synced, or nothing to do; 2 bad input; 3 a live job owns the spool, or another writer's
    chunk is in S3; 4 a tracker is behind (a later sync sends the rest); 5 the spool's volume is full; 6 S3
    failed."""
    from beacon.sync import main as sync_main

    argv = [str(spool_dir)]
    argv += ["--bucket", bucket] if bucket else []
    argv += ["--region", region] if region else []
    argv += [part for name in mirror or [] for part in ("--mirror", name)]
    argv += ["--no-mirrors"] if no_mirrors else []
    raise typer.Exit(sync_main(argv))
