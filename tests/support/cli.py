"""The `beacon` command as a user runs it: a real subprocess, against an embedded AWS endpoint."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.moto_server import REGION
from tests.support.synth import ROOT


def against(endpoint: str, **keys: str) -> dict[str, str]:
    """This environment without its AWS and Beacon settings, pointed at `endpoint` (any keys by default)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BEACON_"))}
    env.update(AWS_ENDPOINT_URL=endpoint, AWS_REGION=REGION, AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y")
    env.update(keys)
    return env


def beacon(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "beacon_ops.cli", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
