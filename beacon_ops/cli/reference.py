"""The click group typer builds from `beacon`'s app: what mkdocs-click reads for docs/cli.md, so the CLI
reference is the command itself and cannot drift from it."""

from __future__ import annotations

import typer

from beacon_ops.cli.main import app

command = typer.main.get_command(app)
