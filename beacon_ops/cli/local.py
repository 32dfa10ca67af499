"""`beacon local`: the whole flow on an embedded AWS (moto), and the demo's pass/fail rule."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from beacon_ops.cli.common import console


def local(
    workdir: Annotated[Path, typer.Option(envvar="BEACON_DEMO_DIR")] = Path(".beacon/demo"),
    steps: Annotated[int, typer.Option(min=1)] = 200,
    ranks: Annotated[int, typer.Option(min=1, max=4)] = 2,
) -> None:
    """The whole flow on an embedded AWS (moto): no account needed. What `make demo` runs."""
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
