#!/usr/bin/env python3
"""Read the team's config and build its stacks; nothing else."""

import sys

from aws_cdk import App

from config import ConfigError, load_team
from config.model import DEMO_TEAM
from stacks.beacon_app import build_app

app = App()
try:
    team_config = load_team(str(app.node.try_get_context("team") or DEMO_TEAM))
except ConfigError as error:
    for line in error.lines:
        print(f"beacon: {line}", file=sys.stderr)
    sys.exit(2)
build_app(app, team_config)
app.synth()
