"""The documentation site (docs/, mkdocs.yml): it builds strictly (a broken link or a page left out of the
navigation fails), and what its pages state about the code is checked against the code."""

from __future__ import annotations

import dataclasses
import html
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
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


# --- Every Python block of the README and the runtime's pages runs (issue 28, item 5) -------------------------
README = ROOT / "README.md"
PAGES_WITH_CODE = [README, *sorted((ROOT / "docs" / "runtime").glob("*.md")), ROOT / "docs" / "integrations.md"]
PYTHON_FENCE = re.compile(r"^(?P<indent>[ \t]*)```py(thon)?\b[^\n]*\n(?P<code>.*?)^(?P=indent)```", re.M | re.S)
FRAGMENT = re.compile(r"<!-- docs-test: fragment of ([\w/., ]+?) -->\s*$")
# The blocks that do not run on their own, each marked on the page with the examples that run it in full
# (tests/test_examples.py runs them): listed here, so no block escapes without a line in this file.
FRAGMENTS = {"docs/integrations.md:10": "examples/lightning_module.py, examples/hf_trainer.py"}
# What the pages' loops leave to the reader (their model, its step, their data), defined before each block.
READERS_OWN = """
import torch

steps, lr = 500, 0.01  # 500 steps: the blocks' `(step + 1) % 500` checkpoint is taken once
batch = torch.randn(4, 8)
model = torch.nn.Linear(8, 1)


def build_model():
    return model


def train_step(*_):
    loss = model(batch).pow(2).mean()
    loss.backward()
    return loss.item()
"""


@dataclasses.dataclass(frozen=True)
class PythonBlock:
    where: str  # page:line of its opening fence
    code: str
    fragment_of: str | None  # the examples that run it in full, from its marker


def python_blocks(page: Path) -> list[PythonBlock]:
    text = page.read_text()
    blocks = []
    for fence in PYTHON_FENCE.finditer(text):
        line = text.count("\n", 0, fence.start()) + 1
        before = text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = FRAGMENT.search(before)
        where = f"{page.relative_to(ROOT)}:{line}"
        blocks.append(PythonBlock(where, textwrap.dedent(fence["code"]), marker[1] if marker else None))
    return blocks


def every_python_block() -> list[PythonBlock]:
    return [block for page in PAGES_WITH_CODE for block in python_blocks(page)]


def test_every_python_block_runs_or_is_a_fragment_listed_here_and_marked_on_its_page() -> None:
    blocks = every_python_block()
    assert {b.where: b.fragment_of for b in blocks if b.fragment_of} == FRAGMENTS
    runnable = [b.where for b in blocks if not b.fragment_of]
    assert runnable[0].startswith("README.md:"), "the README's loop is among the blocks that run"
    for block in blocks:
        compile(block.code, block.where, "exec")  # a fragment is still Python
        if block.fragment_of:  # and what it shows of Beacon is what its examples use
            examples = "".join((ROOT / name.strip()).read_text() for name in block.fragment_of.split(","))
            for name in set(re.findall(r"\bBeacon\w+|\brun\.\w+", block.code)):
                assert name.split(".")[-1] in examples, f"{block.where}: {name} is in none of {block.fragment_of}"


def test_the_readme_loop_and_the_runtime_pages_blocks_run_through_beacon_local_on_one_embedded_aws(
    tmp_path: Path,
) -> None:
    """Each block, as the page shows it, is the reader's `train.py`: `beacon local -- python train.py` runs it as the
    demo team's writer; the first leaves the embedded AWS up (--keep) for the others, the last stops it."""
    from tests.test_local import CHECKOUT, MARKER, demo_processes

    runnable = [block for block in every_python_block() if not block.fragment_of]
    workdir = tmp_path / "beacon"
    env = {**os.environ, MARKER: str(workdir), "PYTHONPATH": CHECKOUT, "COLUMNS": "200"}

    def beacon_local(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "beacon_ops.cli", "local", "--workdir", str(workdir), *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip

    try:
        for number, block in enumerate(runnable):
            script = tmp_path / f"block_{number}.py"
            script.write_text(f"{READERS_OWN}\n# {block.where}\n{block.code}")
            named = re.search(r'beacon\.init\("([\w-]+)"', block.code)  # a block that names its experiment
            keep = ["--keep"] if number < len(runnable) - 1 else []
            done = beacon_local("--experiment", named[1] if named else "default", "--run", f"docs-{number}", *keep,
                                "--", sys.executable, script.name)  # fmt: skip
            assert done.returncode == 0, f"{block.where}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
            report = json.loads((workdir / "report.json").read_text())
            assert report["doctor"] == "finished" and report["verification"]["records_in_s3"] == 500, block.where
    finally:
        beacon_local("--stop")
    assert demo_processes(workdir) == [], "nothing left running"


# --- The runtime's install line (issue 28, item 2) -------------------------------------------------------------
def test_the_readmes_runtime_install_line_names_declared_extras_and_installs_offline_into_a_fresh_venv(
    tmp_path: Path,
) -> None:
    """`pip install './runtime[torch]'`, as a training image or a laptop runs it: the runtime's wheel, nothing of
    the checkout, in a venv of its own (no index: this proves the package, not PyPI)."""
    readme = README.read_text()
    (install_extras, *_) = re.findall(r"pip install '\./runtime\[([\w,]+)\]'", readme)
    declared = tomllib.loads((ROOT / "runtime" / "pyproject.toml").read_text())["project"]
    extras = set(declared["optional-dependencies"])
    assert set(install_extras.split(",")) <= extras
    assert {"torch", *re.findall(r"`\[(\w+)\]`", readme)} == extras, "the README names every extra"

    source = tmp_path / "source"  # a copy: the checkout gets no build/ or egg-info
    shutil.copytree(ROOT / "runtime" / "beacon", source / "beacon", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "runtime" / "pyproject.toml", source)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(source)],
                   check=True, capture_output=True, cwd=tmp_path, timeout=120)  # fmt: skip
    (wheel,) = tmp_path.glob("beacon-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "fresh")], check=True, timeout=60)
    fresh = tmp_path / "fresh" / "bin" / "python"
    subprocess.run([*pip, "--python", str(fresh), "install", "--no-deps", "--no-index", f"{wheel}[{install_extras}]"],
                   check=True, capture_output=True, cwd=tmp_path, timeout=120)  # fmt: skip
    probe = "import beacon, importlib.metadata as m; print(beacon.__file__, m.version('beacon'), beacon.RunSettings)"
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(fresh), "-c", probe], cwd=tmp_path, env=bare, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    where, installed, _ = done.stdout.split(maxsplit=2)
    assert Path(where).is_relative_to(tmp_path / "fresh") and installed == declared["version"]


def test_the_readme_is_short_and_reaches_see_it_work_and_your_own_loop_in_its_first_120_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250

    def first(text: str) -> int:
        return next(number for number, line in enumerate(lines, 1) if text in line)

    assert first("make demo   #") < first("records_lost") < 120, "(a) the demo and what its success looks like"
    assert first("pip install './runtime") < first("run.load_checkpoint()") < 120, "(b) install, the loop"
    assert first("beacon local -- python train.py") < 120, "(b) the reader's own script, with no account"
    headings = [line for line in lines if line.startswith("## ")]
    assert any("`beacon doctor`" in heading for heading in headings), "the doctor is findable from the contents"
