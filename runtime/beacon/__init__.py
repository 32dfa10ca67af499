"""Beacon's training runtime: the library teams import in their own training, so its metrics are
never silently lost. Imports nothing of Beacon's outside this package.

    import beacon
    run = beacon.init("my-experiment")
    run.log({"loss": loss}, step)
    run.finish()
"""

from beacon.contract import FinalState, Record
from beacon.lifeline import dataloader_worker_dies_with_its_rank as worker_init_fn
from beacon.preflight import PreflightError
from beacon.run import FinishReport, Run, init
from beacon.settings import RunSettings, SettingsError
from beacon.spool import SpoolDiskError, SpoolFullError

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
