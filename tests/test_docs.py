"""The documentation site (docs/, mkdocs.yml): it builds strictly (a broken link or a page left out of the
navigation fails), and what its pages state about the code is checked against the code."""

from __future__ import annotations

import dataclasses
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from beacon.ranks import rank_document_name
from beacon.settings import RunSettings

from beacon_ops.cli import reference
from beacon_ops.doctor.diagnosis import Diagnosis
from tests.conftest import WriterSession
from tests.support.synth import ROOT

SETTINGS_PAGE = ROOT / "docs" / "runtime" / "settings.md"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `make docs` builds it, strictly, once for this file's tests."""
    built = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(built)],
        cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return built


def test_the_site_builds_strictly(site: Path) -> None:
    assert (site / "runtime" / "settings" / "index.html").is_file()
    assert (site / "cli" / "index.html").is_file()


def test_the_cli_reference_is_every_subcommand_and_option_of_the_real_command(site: Path) -> None:
    """docs/cli.md is generated from the command's click group: a command or option added, renamed or dropped
    shows there at the next build."""
    page = html.unescape((site / "cli" / "index.html").read_text())
    sections = re.findall(r'<h3 id="([\w-]+)"', page)
    assert sections == sorted(reference.command.commands)  # type: ignore[attr-defined]
    assert {"smoke", "run", "doctor", "local", "sync", "tensorboard"} <= set(sections)
    for name, command in reference.command.commands.items():  # type: ignore[attr-defined]
        section = page.split(f'<h3 id="{name}"', 1)[1].split("<h3 ", 1)[0]
        assert f"beacon {name} [OPTIONS]" in section, name
        shown = [param for param in command.params if not getattr(param, "hidden", False)]
        for option in (opt for param in shown for opt in param.opts if opt.startswith("--")):
            assert option in section, f"beacon {name} {option}"


def shown_default(value: object) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value in ("", ()):
        return "empty"
    return f"`{value}`"


def test_the_settings_table_is_every_setting_with_its_variable_and_default() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `(BEACON_\w+)` \| ([^|]+) \|", SETTINGS_PAGE.read_text(), re.MULTILINE)
    table = [(name, variable, default.strip()) for name, variable, default in rows]
    expected = [
        (f.name, "BEACON_RUN_ID" if f.name == "run" else f"BEACON_{f.name.upper()}", shown_default(f.default))
        for f in dataclasses.fields(RunSettings)
    ]
    assert table == expected
    for setting in dataclasses.fields(RunSettings):  # each variable named is the one that sets it
        variable = next(v for name, v, _ in table if name == setting.name)
        resolved = RunSettings.resolve({"BEACON_BUCKET": "b", variable: another_value(setting.name, setting.default)})
        assert getattr(resolved, setting.name) != setting.default, variable


def another_value(name: str, default: object) -> str:
    """A valid value other than the default, as text in the environment."""
    if name == "wandb_mode":
        return "offline"
    if isinstance(default, bool):
        return str(not default).lower()
    if isinstance(default, int | float):
        return str(default * 2 + 1)
    if isinstance(default, tuple):
        return "wandb" if name == "mirrors" else "loss,lr"
    return "/elsewhere" if isinstance(default, Path) else "other-1"


def text_blocks(page: Path) -> list[str]:
    return [block.strip() for block in re.findall(r"```text\n(.*?)```", page.read_text(), re.DOTALL)]


def test_the_doctors_example_verdicts_are_what_it_says_on_such_a_run(as_writer: WriterSession) -> None:
    """Issue 27: the examples are produced, not written by hand."""
    from tests.test_hostile_evidence import diagnosed, ranks_key, seed_finished_run

    def shown(diagnosis: Diagnosis) -> str:
        (evidence,) = [v for v in diagnosis.verdicts if v.check == "evidence"]
        return f"{diagnosis.headline()}\n[{evidence.status}] evidence: {evidence.verdict}: {evidence.evidence}"

    seed_finished_run(as_writer)
    clean = diagnosed(as_writer)
    finished = shown(clean)
    as_writer.client("s3").put_object(Bucket=as_writer.bucket, Key=ranks_key(rank_document_name(1)), Body=b"[]")
    set_aside = shown(diagnosed(as_writer))
    page = ROOT / "docs" / "doctor.md"
    assert text_blocks(page) == [finished, set_aside]
    listed = re.findall(r"^\| `(\w+)` \|", page.read_text(), re.MULTILINE)
    assert listed == [v.check for v in clean.verdicts], "the checks' table, in the order the doctor gives them"
