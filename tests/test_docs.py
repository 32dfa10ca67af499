"""The documentation site (docs/, mkdocs.yml): it builds strictly (a broken link or a page left out of the
navigation fails), and what its pages state about the code is checked against the code."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from beacon import contract
from beacon.flight_recorder import FLIGHT_RECORDER_PREFIX
from beacon.ranks import RankProgress, rank_document_name, stacks_name
from beacon.settings import RunSettings

from beacon_ops.doctor.diagnosis import Diagnosis
from beacon_ops.doctor.flight_recorder import FlightRecorderReading, Mismatch
from beacon_ops.evidence.reading import RunEvidence
from tests.conftest import WriterSession
from tests.support.synth import ROOT

SETTINGS_PAGE = ROOT / "docs" / "runtime" / "settings.md"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "runtime" / "settings" / "index.html").is_file()


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


# --- the rank verdicts on docs/runtime/loop.md: each as the doctor says it on such evidence ----------------------
LOOP_PAGE = ROOT / "docs" / "runtime" / "loop.md"
C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def rank_document(rank: int, step: int, pod: str, node: str, instance: str = "", written: float = 100.0) -> bytes:
    document = RankProgress(rank, rank % 2, 4, step, "training", 95.0, written, written - 95, 1, pod, node, instance, 1)
    return json.dumps(dataclasses.asdict(document)).encode()


def stall_dump(rank: int, step: int, *frames: str, at: float = 1.0) -> bytes:
    """A rank's stall dump as faulthandler writes it: its main thread, innermost first."""
    lines = "".join(f'  File "{file}", line {line} in {function}\n' for file, line, function in map(str.split, frames))
    return (f"--- rank {rank} pid 1 at {at}, step {step}: no progress for 95 s after step {step}\n"
            f"Current thread 0x1 (most recent call first):\n{lines}").encode()  # fmt: skip


def rank_check(run: str, files: dict[str, bytes], *, live: int | None = None, **recorded: Any) -> Any:
    """The doctor's rank check (its verdict, and the rank it names) on these ranks' files, as uploaded at the
    attempt's end or in `live` snapshot; `recorded`: the first mismatch torch's analyser read from their dumps."""
    from beacon_ops.doctor.diagnosis import _stopped_rank

    def key(name: str) -> str:
        if live is None:
            return contract.rank_evidence_key("smoke", run, 0, name)
        return contract.live_rank_evidence_key("smoke", run, 0, live, name)

    evidence = RunEvidence("smoke", run, rank_files=files, rank_file_keys={name: key(name) for name in files})
    dumps = [key(f"{FLIGHT_RECORDER_PREFIX}{r}") for r in range(4)]
    return _stopped_rank(evidence, FlightRecorderReading(dumps, mismatch=Mismatch(**recorded)) if recorded else None)


def four_ranks(run: str, hung: tuple[str, ...], places: list[tuple[str, str, str]], step: int) -> dict[str, bytes]:
    """Rank 3 stopped in `hung`, ranks 0-2 wait in the next all_reduce."""
    files = {rank_document_name(r): rank_document(r, step, *places[r]) for r in range(4)}
    waiting = (f"{C10D} 2793 all_reduce", "smoke_job/job.py 74 train")
    files |= {stacks_name(r): stall_dump(r, step, *waiting) for r in range(3)} | {
        stacks_name(3): stall_dump(3, step, *hung)
    }
    return files


def example_shown(example: str, produced: str) -> bool:
    """An example on the page is what the doctor said, where it shows `...` for what it leaves out: a line of
    its own stands for any lines (none too), within a line for any text."""
    pattern = "".join(
        r"(?:[^\n]*\n)*?" if line.strip() == "..." else ".*?".join(map(re.escape, line.split("..."))) + r"\n"
        for line in example.splitlines()
    )
    return re.fullmatch(pattern, produced + "\n", re.DOTALL) is not None


def test_the_rank_verdicts_on_the_runtime_loop_page_are_what_the_doctor_says_on_such_evidence() -> None:
    """Issue 27: the examples are produced, not written by hand; each example of a verdict on the page is one."""
    smoke = [("train-0", "node-0", "")] * 2 + [("train-1", "node-1", "")] * 2
    (hung, _) = rank_check("hang-r3", four_ranks("hang-r3", ("smoke_job/job.py 69 train",), smoke, 20),
                        operation="gloo:all_reduce", sequence_id=58, group="0:default_pg", joined=[0, 1, 2],
                        missing=[3])  # fmt: skip
    (live, _) = rank_check("hang-r3", four_ranks("hang-r3", ("smoke_job/job.py 69 train",), smoke, 20), live=0)
    # Rank 0 frozen: no dump, its document written before the others dumped and wait
    frozen = {rank_document_name(r): rank_document(r, 16, *smoke[r], written=100.0 if r else 90.0) for r in range(4)}
    frozen |= {stacks_name(r): stall_dump(r, 16, f"{C10D} 2793 all_reduce", at=95.0) for r in (1, 2, 3)}
    (silent, _) = rank_check("freeze-r0", frozen)
    # Node-local directories, rank 0's node sent nothing
    alone = {rank_document_name(r): rank_document(r, 16, *smoke[r]) for r in (2, 3)}
    alone |= {stacks_name(r): stall_dump(r, 16, f"{C10D} 2793 all_reduce") for r in (2, 3)}
    (sent_nothing, _) = rank_check("lost-node-0", alone)
    produced = [hung.evidence, live.fix, silent.evidence, sent_nothing.evidence]

    page = LOOP_PAGE.read_text()
    blocks = re.findall(r"^ *```(\w*)\n(.*?)^ *```$", page, re.M | re.S)
    (notification,) = [textwrap.dedent(text).strip() for _, text in blocks if text.lstrip().startswith("Subject:")]
    prose = " ".join(re.sub(r"^ *```\w*\n.*?^ *```$", "", page, flags=re.M | re.S).split())
    # Each inline example of a verdict (not a pattern of one: `rank 0 ... hung at step N in <phase>`)
    verdict = re.compile(r"(rank(\(s\))? [\d, ]+ |its stack: )")
    examples = [code for code in re.findall(r"`([^`]+)`", prose) if verdict.match(code) and "<" not in code]
    assert len(examples) == len(produced), examples
    for example, said in zip(examples, produced, strict=True):
        assert example_shown(example, said), f"the page shows\n  {example}\nthe doctor says\n  {said}"
    assert_the_notification_is_what_the_function_publishes(notification)


def assert_the_notification_is_what_the_function_publishes(shown: str) -> None:
    from beacon_ops.doctor.notify import AlarmedRun, message_of, subject_of

    place = [("train-0-d4f1c", "ip-10-0-1-5.ec2.internal", "g6.12xlarge")] * 2
    place += [("train-1-7xk2p", "ip-10-0-2-7.ec2.internal", "g6.12xlarge")] * 2
    hanging = ("/app/model.py 41 forward", "/app/train.py 88 train_step", "/app/train.py 120 main")
    check, stopped = rank_check("hang-r3", four_ranks("hang-r3", hanging, place, 50))
    diagnosis = Diagnosis("demo", "smoke", "hang-r3", "rank-hung", verdicts=[check], lead="rank", stopped_rank=stopped)
    alarm = contract.run_alarm_name("demo", "smoke", "hang-r3", contract.RunAlarm.METRICS_LOST)
    stalled = contract.run_alarm_name("demo", "smoke", "hang-r3", contract.RunAlarm.STALLED)
    alarmed = AlarmedRun(alarm, "demo", "smoke", "hang-r3", f"{stalled} in ALARM")
    published = f"Subject: {subject_of(alarmed, diagnosis)}\n\n{message_of(alarmed, diagnosis, '<bucket>')}"
    assert example_shown(shown, published), f"the page shows\n{shown}\nthe function publishes\n{published}"
