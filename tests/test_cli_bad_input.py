"""Bad input on the `beacon` command: one line naming the option, exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.synth import ROOT

RUN = ["run", "--team", "demo", "--image", ":v1"]
CASES = {
    "unknown_flag": (["doctor", "--team", "demo", "--run", "r", "--colour", "x"], "No such option: --colour"),
    "run_id_not_s3_safe": (["doctor", "--team", "demo", "--run", "Bad/Run"], "run 'Bad/Run' must be 1-63 of a-z"),
    "experiment_not_s3_safe": (
        ["doctor", "--team", "demo", "--run", "r", "--experiment", "a b"],
        "experiment 'a b' must be 1-63 of a-z",
    ),
    "missing_run": (["doctor", "--team", "demo"], "give one of --run (a Beacon run) or --job"),
    "run_id_with_a_trailing_newline": (["doctor", "--team", "demo", "--run", "r1\n"], "run 'r1\\n' must be 1-63"),
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
    # beacon run: each bad setting names its option (or CMD), before any AWS call
    "run_empty_command": ([*RUN], "beacon run: CMD: empty"),
    "run_launcher_in_command": ([*RUN, "--", "python", "train.py"], "CMD: starts with 'python'"),
    "run_command_options_need_double_dash": ([*RUN, "train.py", "--lr", "3"], "No such option: --lr"),
    "run_zero_nodes": ([*RUN, "--nodes", "0", "--", "train.py"], "beacon run: --nodes: must be >= 1, got 0"),
    "run_negative_gpus": ([*RUN, "--gpus-per-node", "-1", "--", "train.py"], "--gpus-per-node: must be >= 0"),
    "run_gpus_over_the_pool": (
        [*RUN, "--gpus-per-node", "9", "--", "train.py"],
        "--gpus-per-node: 9 is more than the GPU pool's cap, compute.gpu_limit = 8",
    ),
    "run_nodes_times_gpus_over_the_pool": (
        [*RUN, "--nodes", "3", "--gpus-per-node", "4", "--", "train.py"],
        "--nodes: 3 nodes of 4 GPUs is more than the GPU pool's cap",
    ),
    "run_image_not_a_reference": (
        ["run", "--team", "demo", "--image", "not an image", "--", "train.py"],
        "--image: 'not an image' is not an image reference naming its registry",
    ),
    "run_image_without_tag": (
        ["run", "--team", "demo", "--image", "registry.example.com/ml/train", "--", "train.py"],
        "--image: 'registry.example.com/ml/train' is not an image reference with a tag or digest",
    ),
    "run_image_without_registry": (
        ["run", "--team", "demo", "--image", "pytorch/pytorch:2.3", "--", "train.py"],
        "--image: 'pytorch/pytorch:2.3' is not an image reference naming its registry",
    ),
    "run_missing_image": (["run", "--team", "demo", "--", "train.py"], "Missing option '--image'"),
    "run_unknown_target": ([*RUN, "--target", "gke", "--", "train.py"], "Invalid value for '--target'"),
    "run_run_id_not_s3_safe": ([*RUN, "--run", "Bad_Run", "--", "train.py"], "--run: 'Bad_Run' must be"),
    "run_run_id_with_a_trailing_newline": ([*RUN, "--run", "r1\n", "--", "train.py"], "--run: 'r1\\n' must be"),
    "run_image_with_a_trailing_newline": (
        ["run", "--team", "demo", "--image", "registry.example.com/ml/train:v1\n", "--", "train.py"],
        "--image: 'registry.example.com/ml/train:v1\\n' is not an image reference",
    ),
    "run_run_id_too_long": ([*RUN, "--run", "r" * 53, "--", "train.py"], "a Job name takes 52"),
    "run_env_not_a_pair": ([*RUN, "--env", "NCCL_DEBUG", "--", "train.py"], "--env: 'NCCL_DEBUG' must be NAME=VALUE"),
    "run_unknown_team": (["run", "--team", "nosuch", "--image", ":v1", "--", "train.py"], "unknown team 'nosuch'"),
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
