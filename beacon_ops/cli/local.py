"""`beacon local`: the whole flow on an embedded AWS (moto), and the demo's pass/fail rule."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from beacon_ops.cli.common import console


def local(
    ctx: typer.Context,
    workdir: Annotated[Path, typer.Option(envvar="BEACON_DEMO_DIR")] = Path(".beacon/demo"),
    steps: Annotated[int, typer.Option(min=1, help="the smoke job's steps (the demo)")] = 200,
    ranks: Annotated[int, typer.Option(min=1, max=4, help="the smoke job's ranks (the demo)")] = 2,
    experiment: Annotated[
        str, typer.Option(help="with a command: the experiment its beacon.init writes under")
    ] = "default",
    run_id: Annotated[
        str | None, typer.Option("--run", help="with a command: its run id (default: the experiment and the time)")
    ] = None,
    keep: Annotated[
        bool, typer.Option(help="with a command: leave the embedded AWS running for the next one and the doctor")
    ] = False,
    stop: Annotated[bool, typer.Option(help="stop the embedded AWS --keep left running, and exit")] = False,
) -> None:
    """The whole flow on an embedded AWS (moto): no account needed. Alone, the smoke job and three classic
    failures (what `make demo` runs); `beacon local -- <command>`: your own command (`python train.py`,
    `torchrun --nproc-per-node 2 train.py`) as the demo team's writer, then what reached S3 and CloudWatch, the
    alarms and the doctor."""
    if stop:
        from beacon_ops.local.own_command import LocalAws

        kept = LocalAws.kept(workdir)
        if kept is not None:
            kept.stop()
        console.print(f"beacon local: {'stopped the embedded AWS at ' + kept.url if kept else 'none kept'}")
        return
    if ctx.args:
        own(ctx.args, workdir, experiment=experiment, run_id=run_id, keep=keep)
        return
    from beacon_ops.local.demo import run_local

    with console.status("beacon local") as status:

        def log(line: str) -> None:
            status.update(line)
            console.log(line)

        report = run_local(workdir, steps=steps, ranks=ranks, log=log)
    data = report.as_dict()
    table = Table(title=f"beacon local: run {report.run} ({data['wall_seconds']} s)")
    table.add_column("what")
    table.add_column("result", overflow="fold")
    for key in (
        "steps",
        "ranks",
        "records_written",
        "records_in_s3",
        "records_lost",
        "records_duplicated",
        "writer_ranks",
        "checkpoints",
        "cloudwatch_datapoints",
        "doctor",
    ):
        table.add_row(key, str(data[key]))
    for name, state in sorted(data["alarms"].items()):
        table.add_row(f"alarm {name}", state)
    for name, scenario in data["scenarios"].items():
        table.add_row(
            f"scenario {name}", f"{scenario['verdict']} in {scenario['seconds_to_verdict']} s — {scenario['detail']}"
        )
    console.print(table)
    console.print(f"report: {workdir / 'report.json'}   picture: {data['picture']}")
    expected = {
        "permission": "permission",
        "frozen-doctor": "silent",
        "frozen-alarm": "ALARM",
        "tmpfs-spool": "refused",
    }
    scenarios_ok = all(data["scenarios"][k]["verdict"] == v for k, v in expected.items())
    silent_in_budget = data["scenarios"]["frozen-alarm"]["seconds_to_verdict"] <= 120
    good = report.verification.ok and report.doctor.healthy and scenarios_ok and silent_in_budget
    if not good:
        print("beacon local: the demo did not hold; see the table and report.json", file=sys.stderr)
    raise typer.Exit(0 if good else 1)


def own(command: list[str], workdir: Path, *, experiment: str, run_id: str | None, keep: bool) -> None:
    from beacon import contract

    from beacon_ops.local.own_command import LocalAws, kept_lines, new_run_id, run_own_command

    try:
        contract.validate_id("experiment", experiment)
        run = contract.validate_id("run", run_id) if run_id is not None else new_run_id(experiment)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    result = run_own_command(command, workdir, experiment=experiment, run=run, keep=keep, log=console.log)
    table = Table(title=f"beacon local: {' '.join(command)} (experiment {experiment}, run {run})")
    table.add_column("what")
    table.add_column("result", overflow="fold")
    table.add_row("exit code", str(result.exit_code))
    if result.verification is not None:
        v = result.verification
        for key in ("records_in_s3", "records_lost", "records_duplicated", "records_superseded", "writer_ranks"):
            table.add_row(key, str(getattr(v, key)))
        table.add_row("metrics in CloudWatch", ", ".join(v.metrics_present) or "none")
        for name, state in sorted(v.alarms.items()):
            table.add_row(f"alarm {name}", state)
    table.add_row("doctor", result.doctor.headline() if result.doctor is not None else result.unreadable)
    console.print(table)
    console.print(f"report: {workdir / 'report.json'}")
    kept = LocalAws.kept(workdir) if keep else None
    for line in kept_lines(kept, experiment=experiment, run=run) if kept is not None else []:
        console.print(line, soft_wrap=True)
    if not result.ok:
        print(
            f"beacon local: {' '.join(command)}: the run did not hold; see the table and report.json", file=sys.stderr
        )
    raise typer.Exit(0 if result.ok else 1)
