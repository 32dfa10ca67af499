"""Issue 29's "one of each", held by the code's own text: the chunk delivery and the events key's parser exist once.
(The create-only write, the stall rule and the final-state rule have tests beside them: test_create_only,
test_ranks, test_contract_final_state.)"""

from __future__ import annotations

import ast
import re
import subprocess
import sys

from tests.support.synth import ROOT

SOURCES = [
    path
    for room in ("runtime/beacon", "beacon_ops")
    for path in sorted((ROOT / room).rglob("*.py"))
    if "contract" not in path.relative_to(ROOT).parts
]


def test_a_sealed_chunk_is_delivered_by_one_function_the_uploader_and_sync_share() -> None:
    """The runtime's functions that write under an events key (a create-only write and an events key in one body;
    the operator writes none but the bench's synthetic run, `beacon_ops/local/long_run.py`)."""
    writers = []
    for path in (p for p in SOURCES if p.is_relative_to(ROOT / "runtime")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                called = {ast.unparse(n.func).split(".")[-1] for n in ast.walk(node) if isinstance(n, ast.Call)}
                if {"events_key", "put_create_only"} <= called or {"events_key", "put_object"} <= called:
                    writers.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert writers == ["runtime/beacon/sinks/chunk_delivery.py:deliver_chunk"], writers
    for caller in ("runtime/beacon/sinks/chunk_uploader.py", "runtime/beacon/sync.py"):
        assert "deliver_chunk(" in (ROOT / caller).read_text(), caller


def test_an_events_key_is_read_back_by_the_contract_alone() -> None:
    """Changing the key's format is one file: the contract's layout, which writes it and reads it back."""
    spelled = [str(p.relative_to(ROOT)) for p in SOURCES if re.search(r'["\']chunk-|chunk-\(', p.read_text())]
    assert spelled == ["runtime/beacon/log/spool.py"], spelled  # the spool's own file names on the volume


def test_beacon_sync_loads_nothing_of_the_uploaders_tensorboard_view() -> None:
    """A recovery pod with the runtime's own dependencies (boto3, orjson) runs `python -m beacon.sync`."""
    probe = (
        "import sys, beacon.sync; print(sorted(m for m in sys.modules if m.split('.')[0] in {'tensorboard', 'torch'}))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout[:500]


def test_an_events_key_reads_back_as_the_contract_writes_it_and_nothing_else_does() -> None:
    from beacon import contract

    for number in (0, 5, 99_999_999, 123_456_789):
        assert contract.chunk_of_events_key(contract.events_key("e", "r", number)) == number
    for stray in (
        "experiments/e/r/events/chunk-5.jsonl",
        "experiments/e/r/events/x/chunk-00000005.jsonl",
        "experiments/e/r/index/chunk-00000005.jsonl",
        "experiments/e/r/events/chunk-000000005.jsonl",
    ):
        assert contract.chunk_of_events_key(stray) is None, stray  # fmt: skip
