"""A rank's error file: Beacon's one line where torchrun's summary shows it, and its exit code for the launcher.

Under torchrun every worker's uncaught exception ends inside a ChildFailedError dump of 65-92 lines; torchrun
prints each failed worker's error file (torchelastic's `TORCHELASTIC_ERROR_FILE`, which it sets per worker) as
that worker's "traceback". `beacon.init` writes its one line there when it raises, so the summary shows the
cause rather than a hint to enable tracebacks, and `beacon.launch` prints the line last and exits with the code
it carries (a failed preflight 3, bad input 2: no retry fixes either), not torchrun's 1. A team's
`@record` writes the same file with its own traceback, whose first line still names Beacon's error.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from beacon import contract

ERROR_FILE_VARIABLE = "TORCHELASTIC_ERROR_FILE"
EXIT_CODE_FIELD = "beacon_exit_code"
PREFIX = "beacon: "
# The exceptions whose one line a team's `@record` writes as "<type>: <line>", and the codes they mean.
EXIT_CODES_BY_TYPE = {"PreflightError": contract.EXIT_PREFLIGHT, "SettingsError": contract.EXIT_BAD_INPUT}


def record(error: BaseException, *, exit_code: int, environ: dict[str, str] | None = None) -> None:
    """Write `error`'s one line into this worker's error file, if torchrun gave it one; never raises."""
    path = (os.environ if environ is None else environ).get(ERROR_FILE_VARIABLE)
    if not path:
        return
    line = f"{PREFIX}{type(error).__name__}: {error}"
    document = {
        "message": {
            "message": line,
            "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time())), EXIT_CODE_FIELD: exit_code},
        }
    }
    try:
        with open(path, "w") as handle:
            json.dump(document, handle)
    except OSError:
        pass  # the error itself is raised all the same


def clear(environ: dict[str, str] | None = None) -> None:
    """Remove a line an earlier `beacon.init` of this process wrote (one that failed, then succeeded), and
    nothing else: a team's own error file stays."""
    path = (os.environ if environ is None else environ).get(ERROR_FILE_VARIABLE)
    if path and _ours(_read(path)):
        with contextlib.suppress(OSError):
            os.unlink(path)


def failure_of(data: Any) -> tuple[int, str] | None:
    """From a failed worker's error file (torchrun's parsed `error_file_data`): Beacon's exit code and one line,
    whether Beacon wrote the file or a team's `@record` wrote the Beacon error it caught; None otherwise."""
    message = data.get("message") if isinstance(data, dict) else None
    extra: Any
    if isinstance(message, str):
        line, extra = message, {}
    elif isinstance(message, dict) and isinstance(message.get("message"), str):
        line, extra = message["message"], message.get("extraInfo") or {}
    else:
        return None
    first = line.strip().splitlines()[0] if line.strip() else ""
    if isinstance(extra, dict) and isinstance(extra.get(EXIT_CODE_FIELD), int):
        return int(extra[EXIT_CODE_FIELD]), first.removeprefix(PREFIX)
    kind = first.split(":", 1)[0].rsplit(".", 1)[-1]
    if kind in EXIT_CODES_BY_TYPE:
        return EXIT_CODES_BY_TYPE[kind], first
    return None


def _read(path: str) -> Any:
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _ours(data: Any) -> bool:
    extra = (data.get("message") or {}).get("extraInfo") if isinstance(data, dict) else None
    return isinstance(extra, dict) and EXIT_CODE_FIELD in extra
