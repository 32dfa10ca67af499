"""Issue 29's "one of each", held by the code's own text: the chunk delivery and the events key's parser exist once.
(The create-only write, the stall rule and the final-state rule have tests beside them: test_create_only,
test_ranks, test_contract_final_state.)"""

from __future__ import annotations

import re

from tests.support.synth import ROOT

SOURCES = [
    path
    for room in ("runtime/beacon", "beacon_ops")
    for path in sorted((ROOT / room).rglob("*.py"))
    if "contract" not in path.relative_to(ROOT).parts
]


def test_a_sealed_chunk_is_delivered_by_one_function_the_uploader_and_sync_share() -> None:
    writers = [str(p.relative_to(ROOT)) for p in SOURCES if "put_create_only(" in p.read_text()]
    chunk_writers = [w for w in writers if "events_key(" in (ROOT / w).read_text() and not w.endswith("index.py")]
    assert chunk_writers == ["runtime/beacon/sinks/chunk_uploader.py"], chunk_writers
    assert "deliver_chunk(" in (ROOT / "runtime/beacon/sync.py").read_text()


def test_an_events_key_is_read_back_by_the_contract_alone() -> None:
    """Changing the key's format is one file: the contract's layout, which writes it and reads it back."""
    spelled = [str(p.relative_to(ROOT)) for p in SOURCES if re.search(r'["\']chunk-|chunk-\(', p.read_text())]
    assert spelled == ["runtime/beacon/log/spool.py"], spelled  # the spool's own file names on the volume
