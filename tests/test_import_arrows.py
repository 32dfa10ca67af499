"""The house's import arrows, executable: each room imports only the rooms listed for it here.

A new arrow is a design decision: add it to ALLOWED with the layout table of docs/architecture.md, or don't."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.support.synth import ROOT

ROOMS = {
    "app": ROOT / "app.py",
    "stacks": ROOT / "stacks",
    "beacon_constructs": ROOT / "beacon_constructs",
    "workloads": ROOT / "workloads",
    "config": ROOT / "config",
    # The runtime's ground floor: the composers (run, telemetry, checkpoint) and the entry points (`python -m
    # beacon.launch`, `python -m beacon.sync`) above its wings; its foundations are rooms of their own, below them.
    "beacon": ROOT / "runtime" / "beacon",
    # The runtime's contract wing: what every room shares and readers need (no threads, no boto, no torch).
    "beacon.contract": ROOT / "runtime" / "beacon" / "contract",
    **{
        f"beacon.{name}": ROOT / "runtime" / "beacon" / f"{name}.py"
        for name in ("settings", "files", "create_only", "aws", "kill_points")
    },
    "beacon.log": ROOT / "runtime" / "beacon" / "log",
    "beacon.process": ROOT / "runtime" / "beacon" / "process",
    "beacon.evidence": ROOT / "runtime" / "beacon" / "evidence",
    "beacon.sinks": ROOT / "runtime" / "beacon" / "sinks",
    "beacon.integrations": ROOT / "runtime" / "beacon" / "integrations",
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
# What every operator room may import besides its own arrows: its ground floor and the runtime's contract, never
# the runtime's writers (threads, boto uploads, fork hooks); `beacon sync` and `beacon local` run the runtime itself.
OPERATOR_GROUND = {"beacon_ops", "beacon.contract"}
# The runtime's foundations: files every wing may use (the run's settings, the atomic file write, the create-only
# S3 write, the AWS clients, the test suite's kill points), each importing the contract at most.
FOUNDATIONS = {
    "beacon.contract",
    "beacon.settings",
    "beacon.files",
    "beacon.create_only",
    "beacon.aws",
    "beacon.kill_points",
}
WINGS = {"beacon.log", "beacon.process", "beacon.evidence", "beacon.sinks"}
ALLOWED = {
    "app": {"config", "stacks"},
    "stacks": {"config", "beacon_constructs", "workloads", "beacon.contract"},
    "beacon_constructs": {"workloads", "beacon.contract"},
    "workloads": {"config", "beacon.contract"},
    # The team model and the names derived from it (config.names); a team name must also fit the
    # runtime's alarm names, so the model asks the contract.
    "config": {"beacon.contract"},
    "beacon": {*FOUNDATIONS, *WINGS},  # the runtime library: nothing of Beacon's outside itself
    "beacon.contract": set(),  # the contract wing: nothing of the runtime outside itself
    "beacon.settings": {"beacon.contract"},
    "beacon.files": set(),
    "beacon.create_only": set(),
    "beacon.aws": set(),
    "beacon.kill_points": set(),
    "beacon.log": FOUNDATIONS,  # the one log: below every other wing
    "beacon.process": FOUNDATIONS,
    "beacon.evidence": FOUNDATIONS,
    # The heartbeat sends what the ranks' documents say (the cross-rank view): sinks read evidence, never back.
    "beacon.sinks": {*FOUNDATIONS, "beacon.log", "beacon.evidence", "beacon.process"},
    "beacon.integrations": {"beacon", *FOUNDATIONS, *WINGS},
    "smoke_job": {"beacon", "beacon.contract"},  # a client of the runtime, like a team's own training
    "examples": {"beacon", "beacon.contract", "beacon.integrations"},
    "beacon_ops": {"config", "beacon"},  # the ground floor: none of the operator's rooms above it
    "beacon_ops.cli": {
        *OPERATOR_GROUND,
        "beacon",  # `beacon sync` is the runtime's `python -m beacon.sync`
        *("beacon_ops.jobs", "beacon_ops.doctor", "beacon_ops.evidence", "beacon_ops.local"),
        *("config", "stacks"),  # stacks.outputs only: see below
    },
    "beacon_ops.jobs": {*OPERATOR_GROUND, "beacon_ops.evidence", "beacon_ops.doctor", "workloads", "config", "stacks"},
    "beacon_ops.doctor": {*OPERATOR_GROUND, "beacon_ops.evidence"},
    "beacon_ops.evidence": OPERATOR_GROUND,  # nothing of the operator above it
    "beacon_ops.local": {*OPERATOR_GROUND, "beacon_ops.evidence", "beacon_ops.doctor", "config"},  # config.names
    "bench": {
        *("beacon_ops", "beacon_ops.local", "beacon_ops.evidence", "beacon_ops.doctor"),
        *("beacon", "beacon.contract", "smoke_job", "config", "stacks", "beacon_constructs"),
        *FOUNDATIONS,
        *WINGS,  # the bench measures the runtime's parts (the rank signal, the GPU's backend)
    },
}


def room_of(module: str) -> str | None:
    """The room a module is in: the longest room name that it is, or that it starts with."""
    rooms = [room for room in ROOMS if module == room or module.startswith(room + ".")]
    return max(rooms, key=len) if rooms else None


def files_of(path: Path) -> list[Path]:
    """A room's files, less those of the rooms inside it (the runtime's contract wing); the operator's ground
    floor is its top-level files alone."""
    if path.suffix == ".py":
        return [path]
    if path == ROOT / "beacon_ops":
        return sorted(path.glob("*.py"))
    inner = [room for room in ROOMS.values() if room != path and room.is_relative_to(path)]
    return sorted(f for f in path.rglob("*.py") if not any(f.is_relative_to(room) for room in inner))


def absolute_module(file: Path, level: int, module: str | None) -> str:
    """What `from <level dots><module> import` in `file` names, as an absolute module."""
    if level == 0:
        return module or ""
    root = ROOT / "runtime" if file.is_relative_to(ROOT / "runtime") else ROOT
    parts = list(file.relative_to(root).with_suffix("").parts) if file.is_relative_to(root) else [file.stem]
    package = parts[:-1]  # a module's package; a package's __init__ is its own
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


def imported_rooms(path: Path) -> dict[str, set[str]]:
    """Each first-party room a room imports, with the files that do."""
    found: dict[str, set[str]] = {}
    for file in files_of(path):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
                # `from beacon import contract` is the contract wing, not the runtime as a whole; `from ..run import`
                # inside a wing is the module it names.
                base = absolute_module(file, node.level, node.module)
                modules = [f"{base}.{alias.name}" for alias in node.names]
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


def test_every_file_of_the_runtime_is_in_a_room_the_arrows_name() -> None:
    """A new file on the runtime's ground floor is a composer or an entry point; anything else goes in a wing."""
    ground = {str(f.relative_to(ROOMS["beacon"])) for f in files_of(ROOMS["beacon"])}
    composers = {"__init__.py", "run.py", "telemetry.py", "checkpoint.py", "sync.py", "launch.py"}
    assert ground == composers, ground


def test_the_arrows_have_no_circle() -> None:
    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})) for nxt in ALLOWED[start])

    assert not [room for room in ALLOWED if reaches(room, room)]


def test_the_arrows_test_sees_a_wrong_arrow(tmp_path: Path) -> None:
    room = tmp_path / "workloads"
    room.mkdir()
    (room / "bad.py").write_text("from beacon_ops import cli\n")
    assert imported_rooms(room) == {"beacon_ops.cli": {str(room / "bad.py")}}


def test_the_arrows_test_sees_the_runtime_where_only_its_contract_may_be_imported(tmp_path: Path) -> None:
    room = tmp_path / "doctor"
    room.mkdir()
    (room / "reader.py").write_text("from beacon import contract\nfrom beacon.evidence.ranks import RankSignal\n")
    assert set(imported_rooms(room)) == {"beacon.contract", "beacon.evidence"}
    runtime_rooms = {room for room in ROOMS if room == "beacon" or room.startswith("beacon.")}
    for reader in ("beacon_ops.doctor", "beacon_ops.evidence"):
        assert ALLOWED[reader] & runtime_rooms == {"beacon.contract"}, reader


def test_the_arrows_test_reads_a_relative_import_as_the_module_it_names(tmp_path: Path) -> None:
    wing = ROOT / "runtime" / "beacon" / "log"
    assert absolute_module(wing / "spool.py", 2, "run") == "beacon.run"
    assert absolute_module(wing / "__init__.py", 1, "spool") == "beacon.log.spool"
    assert room_of(absolute_module(wing / "spool.py", 2, "run") + ".Run") == "beacon"


# What the contract wing may import: the standard library less what starts threads or processes or opens
# sockets, orjson (the spool's optional line writer) and itself.
CONTRACT_REFUSES = {"threading", "_thread", "concurrent", "multiprocessing", "subprocess", "socket", "asyncio"}


def test_the_contract_wing_imports_no_threads_no_boto_no_torch() -> None:
    wrong = []
    for file in files_of(ROOMS["beacon.contract"]):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                allowed = (top in sys.stdlib_module_names and top not in CONTRACT_REFUSES) or top == "orjson"
                if not (allowed or module.startswith("beacon.contract")):
                    wrong.append(f"{file.relative_to(ROOT)}: {module}")
    assert not wrong, wrong


def test_importing_the_contract_starts_no_thread_and_loads_no_boto_or_torch() -> None:
    modules = sorted(f"beacon.contract.{f.stem}" for f in files_of(ROOMS["beacon.contract"]) if f.stem != "__init__")
    probe = (
        "import importlib, sys, threading\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'boto3', 'botocore', 'numpy'})\n"
        "print(threading.active_count(), heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "[]"], done.stdout
