"""Bad input on the `beacon` command: one line naming the option, exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.synth import ROOT

CASES = {
    "unknown_flag": (["doctor", "--team", "demo", "--run", "r", "--colour", "x"], "No such option: --colour"),
    "run_id_not_s3_safe": (["doctor", "--team", "demo", "--run", "Bad/Run"], "Invalid value for '--run'"),
    "experiment_not_s3_safe": (
        ["doctor", "--team", "demo", "--run", "r", "--experiment", "a b"],
        "Invalid value for '--experiment'",
    ),
    "missing_run": (["doctor", "--team", "demo"], "Missing option '--run'"),
    "negative_steps": (["local", "--steps", "-3"], "Invalid value for '--steps'"),
    "unknown_command": (["nosuch"], "No such command 'nosuch'"),
    "smoke_unknown_target": (["smoke", "--team", "demo", "--target", "gke"], "Invalid value for '--target'"),
    "smoke_unknown_team": (["smoke", "--team", "nosuch"], "unknown team 'nosuch'"),
    "smoke_missing_team": (["smoke"], "Missing option '--team'"),
    "smoke_zero_timeout": (["smoke", "--team", "demo", "--timeout", "0"], "Invalid value for '--timeout'"),
    "tensorboard_missing_run": (["tensorboard", "--team", "demo"], "Missing option '--run'"),
    "tensorboard_run_id_not_s3_safe": (["tensorboard", "--team", "demo", "--run", "../x"], "Invalid value for '--run'"),
    "tensorboard_experiment_not_s3_safe": (
        ["tensorboard", "--team", "demo", "--run", "r", "--experiment", "A"],
        "Invalid value for '--experiment'",
    ),
    "tensorboard_port_out_of_range": (
        ["tensorboard", "--team", "demo", "--run", "r", "--port", "70000"],
        "Invalid value for '--port'",
    ),
    "tensorboard_port_not_a_number": (
        ["tensorboard", "--team", "demo", "--run", "r", "--port", "http"],
        "Invalid value for '--port'",
    ),
    "tensorboard_unknown_team": (["tensorboard", "--team", "nosuch", "--run", "r"], "unknown team 'nosuch'"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_exit_code_2(case: str) -> None:
    argv, expected = CASES[case]
    done = subprocess.run(
        [sys.executable, "-m", "beacon_ops.cli", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert expected in lines[0] and lines[0].startswith("beacon")
