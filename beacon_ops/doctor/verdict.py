"""One check's verdict, with its evidence and the fix: what every doctor module returns."""

from __future__ import annotations

from dataclasses import dataclass

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"


@dataclass(frozen=True)
class Verdict:
    check: str
    status: str
    verdict: str
    evidence: str
    fix: str = ""
