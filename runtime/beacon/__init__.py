"""Beacon's training runtime: the library teams import in their own training, so its metrics are
never silently lost. Imports nothing of Beacon's outside this package.

    import beacon
    run = beacon.init("my-experiment")
    run.log({"loss": loss}, step)
    run.finish()

The names below load on first use. `beacon.contract`, the wing readers import alone (the operator, the alarm's
function), holds the record type, the key layout, the rank document and the preflight record, with no threads,
no boto and no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from beacon.contract import FinalState, Record
    from beacon.log.spool import SpoolDiskError, SpoolFullError
    from beacon.process.lifeline import dataloader_worker_dies_with_its_rank as worker_init_fn
    from beacon.process.preflight import PreflightError
    from beacon.run import FinishReport, Run, init
    from beacon.settings import RunSettings, SettingsError

_WHERE = {
    "FinalState": ("beacon.contract", "FinalState"),
    "Record": ("beacon.contract", "Record"),
    "worker_init_fn": ("beacon.process.lifeline", "dataloader_worker_dies_with_its_rank"),
    "PreflightError": ("beacon.process.preflight", "PreflightError"),
    "FinishReport": ("beacon.run", "FinishReport"),
    "Run": ("beacon.run", "Run"),
    "init": ("beacon.run", "init"),
    "RunSettings": ("beacon.settings", "RunSettings"),
    "SettingsError": ("beacon.settings", "SettingsError"),
    "SpoolDiskError": ("beacon.log.spool", "SpoolDiskError"),
    "SpoolFullError": ("beacon.log.spool", "SpoolFullError"),
}

__all__ = [
    "FinalState",
    "FinishReport",
    "PreflightError",
    "Record",
    "Run",
    "RunSettings",
    "SettingsError",
    "SpoolDiskError",
    "SpoolFullError",
    "init",
    "worker_init_fn",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        try:  # a submodule, as `import beacon` used to load them all: beacon.contract, beacon.run, ...
            return importlib.import_module(f"beacon.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"module 'beacon' has no attribute {name!r}") from None
    module, attribute = _WHERE[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value
