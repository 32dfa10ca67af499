"""`make lint` stays clean: ruff (lint and format) and mypy --strict over every package."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.synth import ROOT

COMMANDS = {
    "ruff_check": [".venv/bin/ruff", "check", "."],
    "ruff_format": [".venv/bin/ruff", "format", "--check", "."],
    "mypy": [".venv/bin/mypy"],
}


@pytest.mark.parametrize("tool", sorted(COMMANDS))
def test_lint_is_clean(tool: str) -> None:
    result = subprocess.run(COMMANDS[tool], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
