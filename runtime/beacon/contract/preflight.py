"""The preflight record: what each start of a run writes as its preflight ends (`contract.preflight_key`), passed or
`failed` (and why), and the one parser readers take it through; and preflight's own time as a job's log reports it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from beacon.contract.alarms import STALL_THRESHOLD_S
from beacon.contract.documents import NUMBER, checked_object
from beacon.contract.pace import SLOW_RANK_SHARE

REPORTED_TIME = re.compile(r"preflight (?:stopped after|passed in) ([0-9.]+) s")


def reported_seconds(log_text: str) -> float | None:
    """Preflight's own time, as a job's log reports it on failure and on success: interpreter
    start-up and imports are not preflight, and a busy machine makes them slow."""
    found = REPORTED_TIME.findall(log_text)
    return float(found[-1]) if found else None


@dataclass(frozen=True)
class PreflightRecord:
    run: str
    experiment: str
    host: str
    pid: int
    world_size: int
    spool_dir: str
    spool_filesystem: str
    spool_persistent: bool
    started_at: str
    team: str
    region: str
    s3_endpoint: str
    namespace: str
    heartbeat_interval: float
    stall_dump_after: float = float(STALL_THRESHOLD_S)  # the run's stall threshold, for every stall test
    slow_rank_share: float = SLOW_RANK_SHARE  # the share of a step waited for one rank that makes it slow
    # Why this start stopped in its preflight, once its record could be written (CloudWatch or the run's alarms
    # refused it); empty: it passed, and an attempt of the run began. A reader counts a failed start apart.
    failed: str = ""


# The fields a reader uses of a preflight record, and their types: a record whose field has another is set aside.
PREFLIGHT_FIELDS: dict[str, type | tuple[type, ...]] = {
    "world_size": int, "heartbeat_interval": NUMBER, "stall_dump_after": NUMBER, "slow_rank_share": NUMBER,
    "spool_dir": str,
    "spool_filesystem": str, "spool_persistent": bool, "started_at": str, "host": str, "s3_endpoint": str,
    "region": str, "failed": str,
}  # fmt: skip
PREFLIGHT_REQUIRED = frozenset({"spool_dir", "spool_filesystem", "started_at"})  # what the verdicts read
PREFLIGHT_POSITIVE = frozenset({"world_size", "heartbeat_interval", "stall_dump_after", "slow_rank_share"})


def preflight_document(body: bytes) -> dict[str, object]:
    """A preflight record as a reader takes it; ValueError naming the field when it is not one."""
    return checked_object(body, PREFLIGHT_FIELDS, required=PREFLIGHT_REQUIRED, positive=PREFLIGHT_POSITIVE)
