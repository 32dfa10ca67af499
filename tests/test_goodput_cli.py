"""`beacon goodput` against a real moto server (IAM enforced), on a run the real job wrote (issue 30): the ledger as a
table, a bar per attempt and `--json`, read as the team's reader."""

from __future__ import annotations

import json

import pytest
from beacon.contract.goodput import PRICES_AS_OF, Category

from tests.conftest import WriterSession
from tests.support.cli import against, beacon, operator_of_the_artifacts_stack
from tests.support.job_harness import JobHarness

TEAM, EXPERIMENT, RUN = "demo", "smoke", "gp-cli"


@pytest.fixture
def env(as_writer: WriterSession, strict_aws: str, tmp_path: object) -> dict[str, str]:
    harness = JobHarness(strict_aws, as_writer.bucket, as_writer.workdir / "job", as_writer.credentials)
    done = harness.run("--run-id", RUN, "--steps", "40", "--step-sleep", "0.02")
    assert done.returncode == 0, done.stderr[-3000:]
    keys = operator_of_the_artifacts_stack(as_writer, TEAM)
    return against(as_writer.aws.url, AWS_ACCESS_KEY_ID=keys["aws_access_key_id"],
                   AWS_SECRET_ACCESS_KEY=keys["aws_secret_access_key"])  # fmt: skip


def test_a_runs_ledger_is_a_table_a_bar_per_attempt_and_one_json_object_that_sums_to_its_time(
    env: dict[str, str],
) -> None:
    shown = beacon("goodput", "--team", TEAM, "--run", RUN, env=env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"run {RUN} (experiment {EXPERIMENT}): 1 attempt on 1 instance"), lines[0]
    assert "goodput" in lines[0] and "(no instance type recorded)" in lines[0], "a laptop's run: no price"
    assert {line.split()[0] for line in lines[3:12]} == {c.value for c in Category}, lines
    (bar,) = [line for line in lines if line.startswith("    0 ")]
    assert "#" in bar and len(bar.split()[1]) <= 60 + len(Category), bar
    answer = json.loads(beacon("goodput", "--team", TEAM, "--run", RUN, "--json", env=env).stdout)
    assert (answer["ok"], answer["run"], answer["instances"]) == (True, RUN, 1)
    assert answer["prices"] == f"list prices of {PRICES_AS_OF}"
    seconds = answer["instance_seconds"]
    assert seconds["productive"] > 0 and seconds["setup"] > 0, seconds
    assert sum(seconds.values()) == pytest.approx(sum(answer["attempts"]["0"].values()))
    assert answer["goodput"] == pytest.approx(seconds["productive"] / sum(seconds.values()))
    assert any("no phase intervals are recorded yet" in note for note in answer["notes"]), "said, not hidden"
    assert "  note: no phase intervals are recorded yet" in shown.stdout


def test_a_run_with_no_records_is_one_line_naming_it_and_exit_2(env: dict[str, str]) -> None:
    missing = beacon("goodput", "--team", TEAM, "--run", "never-ran", env=env)
    assert missing.returncode == 2 and missing.stdout == ""
    (line,) = missing.stderr.strip().splitlines()
    assert line.startswith("beacon goodput: run 'never-ran' of experiment 'smoke' has no records in s3://"), line


def test_a_period_lists_every_run_started_in_it_worst_first_with_totals(env: dict[str, str]) -> None:
    shown = beacon("goodput", "--team", TEAM, "--since", "30d", env=env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("since ") and "goodput" in lines[0], lines[0]
    assert any(line.split()[:2] == [RUN, EXPERIMENT] for line in lines[3:]), lines
    answer = json.loads(beacon("goodput", "--team", TEAM, "--since", "12h", "--json", env=env).stdout)
    (run,) = [r for r in answer["runs"] if r["run"] == RUN]
    assert answer["instance_seconds"] >= sum(run["instance_seconds"].values()) > 0
    assert answer["prices"] == f"list prices of {PRICES_AS_OF}" and answer["without_records"] == 0
    for argv, said in ((["--since", "30x"], "--since '30x': a number and d, h or m"),
                       ([], "give one of --run (one run) or --since"),
                       (["--run", RUN, "--since", "1d"], "give one of --run (one run) or --since"),
                       (["--since", "1d", "--experiment", EXPERIMENT], "--experiment goes with --run")):  # fmt: skip
        refused = beacon("goodput", "--team", TEAM, *argv, env=env)
        assert refused.returncode == 2 and said in refused.stderr and len(refused.stderr.splitlines()) == 1, refused
