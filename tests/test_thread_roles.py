"""Issue 29: one class per thread role. Every class of the runtime that starts threads starts them for one target
(the spool writer, the uploader, the heartbeat, a live snapshot, a rank board, ...); the writer's telemetry
composes them and starts none of its own."""

from __future__ import annotations

import ast

from tests.support.synth import ROOT

RUNTIME = ROOT / "runtime" / "beacon"


def thread_targets(cls: ast.ClassDef) -> set[str]:
    """The `target=` of every `threading.Thread(...)` a class's body constructs."""
    targets = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("threading.Thread", "Thread"):
            (target,) = [ast.unparse(k.value) for k in node.keywords if k.arg == "target"]
            targets.add(target)
    return targets


def classes_starting_threads() -> dict[str, set[str]]:
    found = {}
    for path in sorted(RUNTIME.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and (targets := thread_targets(node)):
                found[f"{path.relative_to(RUNTIME)}:{node.name}"] = targets
    return found


def test_each_class_that_starts_threads_starts_them_for_one_role() -> None:
    found = classes_starting_threads()
    assert {
        "sinks/spool_writer.py:SpoolWriter",
        "sinks/chunk_uploader.py:ChunkUploader",
        "sinks/heartbeat.py:Heartbeat",
    } <= set(found)
    several = {where: sorted(targets) for where, targets in found.items() if len(targets) > 1}
    assert several == {}, "a class with more than one thread role: give each its own class"


def test_the_writers_telemetry_composes_its_threads_and_starts_none_of_its_own() -> None:
    assert not any(where.startswith("telemetry.py:") for where in classes_starting_threads())
    source = (RUNTIME / "telemetry.py").read_text()
    for role in ("SpoolWriter(", "ChunkUploader(", "Heartbeat("):
        assert role in source, f"the composer builds {role[:-1]}"
