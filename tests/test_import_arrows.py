"""The house's import arrows, executable: each room imports only the rooms listed for it here.

A new arrow is a design decision: add it to ALLOWED with the README's layout table, or don't."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.synth import ROOT

ROOMS = {
    "app": ROOT / "app.py",
    "stacks": ROOT / "stacks",
    "beacon_constructs": ROOT / "beacon_constructs",
    "workloads": ROOT / "workloads",
    "config": ROOT / "config",
    "beacon": ROOT / "runtime" / "beacon",
    "smoke_job": ROOT / "runtime" / "smoke_job",
    # The operator, by capability: each subpackage is a room; "beacon_ops" is its ground floor (the files
    # at its top: AWS access, credentials, reading synthesized templates, make destroy's teardown).
    "beacon_ops": ROOT / "beacon_ops",
    "beacon_ops.cli": ROOT / "beacon_ops" / "cli",
    "beacon_ops.jobs": ROOT / "beacon_ops" / "jobs",
    "beacon_ops.doctor": ROOT / "beacon_ops" / "doctor",
    "beacon_ops.evidence": ROOT / "beacon_ops" / "evidence",
    "beacon_ops.local": ROOT / "beacon_ops" / "local",
    "bench": ROOT / "bench",
    "examples": ROOT / "examples",
}
OPERATOR_GROUND = {"beacon_ops", "beacon"}  # what every operator room may import besides its own arrows
ALLOWED = {
    "app": {"config", "stacks"},
    "stacks": {"config", "beacon_constructs", "workloads", "beacon"},
    "beacon_constructs": {"workloads", "beacon"},
    "workloads": {"config", "beacon"},
    # The team model and the names derived from it (config.names); a team name must also fit the
    # runtime's alarm names, so the model asks the contract.
    "config": {"beacon"},
    "beacon": set(),  # the runtime library: nothing of Beacon's outside itself
    "smoke_job": {"beacon"},  # a client of the runtime, like a team's own training
    "examples": {"beacon"},
    "beacon_ops": {"config", "beacon"},  # the ground floor: none of the operator's rooms above it
    "beacon_ops.cli": {
        *OPERATOR_GROUND,
        *("beacon_ops.jobs", "beacon_ops.doctor", "beacon_ops.evidence", "beacon_ops.local"),
        *("config", "stacks"),  # stacks.outputs only: see below
    },
    "beacon_ops.jobs": {*OPERATOR_GROUND, "beacon_ops.evidence", "beacon_ops.doctor", "workloads", "config", "stacks"},
    "beacon_ops.doctor": {*OPERATOR_GROUND, "beacon_ops.evidence"},
    "beacon_ops.evidence": OPERATOR_GROUND,  # nothing of the operator above it
    "beacon_ops.local": {*OPERATOR_GROUND, "beacon_ops.evidence", "beacon_ops.doctor", "config"},  # config.names
    "bench": {
        *("beacon_ops", "beacon_ops.local", "beacon_ops.evidence", "beacon_ops.doctor"),
        *("beacon", "smoke_job", "config", "stacks", "beacon_constructs"),
    },
}


def room_of(module: str) -> str | None:
    """The room a module is in: the longest room name that it is, or that it starts with."""
    rooms = [room for room in ROOMS if module == room or module.startswith(room + ".")]
    return max(rooms, key=len) if rooms else None


def files_of(path: Path) -> list[Path]:
    """A room's files; the operator's ground floor is its top-level files alone."""
    if path.suffix == ".py":
        return [path]
    return sorted(path.glob("*.py") if path == ROOT / "beacon_ops" else path.rglob("*.py"))


def imported_rooms(path: Path) -> dict[str, set[str]]:
    """Each first-party room a room imports, with the files that do."""
    found: dict[str, set[str]] = {}
    for file in files_of(path):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = room_of(module)
                if top is not None:
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
