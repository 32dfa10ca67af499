"""One check's verdict, with its evidence and the fix: what every doctor module returns."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"


@dataclass(frozen=True)
class Verdict:
    check: str
    status: str
    verdict: str
    evidence: str
    fix: str = ""
    at: datetime | None = None  # when its evidence happened, where one moment is the evidence (a log line)
