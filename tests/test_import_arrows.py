"""The house's import arrows, executable: each room imports only the rooms listed for it here.

A new arrow is a design decision: add it to ALLOWED with the README's layout table, or don't."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.synth import ROOT

ROOMS = {
    "app": ROOT / "app.py",
    "stacks": ROOT / "stacks",
    "beacon_constructs": ROOT / "beacon_constructs",
    "workloads": ROOT / "workloads",
    "config": ROOT / "config",
    "beacon": ROOT / "runtime" / "beacon",
    "smoke_job": ROOT / "runtime" / "smoke_job",
    "beacon_ops": ROOT / "beacon_ops",
    "bench": ROOT / "bench",
    "examples": ROOT / "examples",
}
ALLOWED = {
    "app": {"config", "stacks"},
    "stacks": {"config", "beacon_constructs", "workloads", "beacon"},
    "beacon_constructs": {"workloads", "beacon"},
    "workloads": {"config", "beacon"},
    # The team model; the runtime's contract still holds the stack names it derives (the house issue moves them).
    "config": {"beacon"},
    "beacon": set(),  # the runtime library: nothing of Beacon's outside itself
    "smoke_job": {"beacon"},  # a client of the runtime, like a team's own training
    "examples": {"beacon"},
    "beacon_ops": {"workloads", "config", "beacon", "stacks"},  # stacks.outputs only: see below
    "bench": {"beacon_ops", "beacon", "smoke_job", "config", "stacks", "beacon_constructs"},
}


def imported_rooms(path: Path) -> dict[str, set[str]]:
    """Each first-party room a room imports, with the files that do."""
    files = [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))
    found: dict[str, set[str]] = {}
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in ROOMS:
                    found.setdefault(top, set()).add(str(file.relative_to(ROOT) if file.is_relative_to(ROOT) else file))
    return found


def test_every_room_imports_only_the_rooms_its_arrows_allow() -> None:
    wrong = []
    for room, path in ROOMS.items():
        if not path.exists():
            continue
        for target, files in imported_rooms(path).items():
            if target != room and target not in ALLOWED[room]:
                wrong.append(f"{room} -> {target} ({', '.join(sorted(files))})")
    assert not wrong, "imports against the arrows:\n" + "\n".join(wrong)


def test_the_operator_reads_the_stacks_output_keys_and_nothing_else_of_them() -> None:
    """The operator reads synthesized templates as files; of stacks/ it imports the output keys only."""
    modules = set()
    for file in sorted((ROOT / "beacon_ops").rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "stacks":
                modules.add(node.module if node.module != "stacks" else f"stacks.{node.names[0].name}")
    assert modules == {"stacks.outputs"}


def test_no_output_key_is_spelled_outside_the_output_keys_module() -> None:
    from stacks import outputs

    keys = {value for name, value in vars(outputs).items() if name.isupper() and isinstance(value, str)}
    # Also CloudWatch's own field and dimension names: AlarmName, ClusterName.
    keys -= {outputs.TEAM_ALARM_SUFFIX, outputs.TEAM_ALARM_OUTPUT_SUFFIX, "ClusterName"}
    spelled = []
    for room in ("stacks", "beacon_ops", "beacon_constructs", "bench"):
        for file in sorted((ROOT / room).rglob("*.py")):
            if file.name == "outputs.py":
                continue
            text = file.read_text()
            spelled += [f"{file.relative_to(ROOT)}: {key}" for key in keys if f'"{key}"' in text]
    assert not spelled


def test_the_arrows_have_no_circle() -> None:
    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})) for nxt in ALLOWED[start])

    assert not [room for room in ALLOWED if reaches(room, room)]


def test_the_arrows_test_sees_a_wrong_arrow(tmp_path: Path) -> None:
    room = tmp_path / "workloads"
    room.mkdir()
    (room / "bad.py").write_text("from beacon_ops import cli\n")
    assert imported_rooms(room) == {"beacon_ops": {str(room / "bad.py")}}
