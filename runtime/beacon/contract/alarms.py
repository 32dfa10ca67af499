"""The health alarms: their periods, budgets and names, and the run alarms' template."""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import Any

from beacon.contract.layout import validate_id

# --- Health alarms: periods and budgets -------------------------------------------------
# A job is silent when its heartbeat stops; stalled when the heartbeat lives but steps do not
# advance. Per-run alarms exist only while a run does (the job creates them after preflight and
# deletes them on a clean exit), so an idle team has nothing that can sit in ALARM.
SILENT_BUDGET_S = 120
HEARTBEAT_PERIOD_S = 30  # high-resolution metrics allow 10, 20 or 30 s periods
# The one default of the heartbeat's interval: the runtime's settings, the team's configuration and the doctor's
# reading of a run whose preflight did not say (a release before it did).
HEARTBEAT_INTERVAL_S = 15
SILENT_EVALUATION_PERIODS = 3  # last beat, then 3 empty periods: ALARM by last beat + 120 s
STALL_THRESHOLD_S = 90  # ProgressAge above this is not progress (phases excluded), sooner at a fast run's pace
# A named phase pauses the stall clock this long at most: a rank hung inside its checkpoint or evaluation
# (a collective in a save, a dead mount) then reads as stalled once the phase is this old (`RunSettings.phase_limit`).
PHASE_LIMIT_S = 1800
# StallRatio (ProgressAge over the run's threshold) only grows while a rank hangs: one period holding one beat past
# the threshold is the stall, so the alarm is in ALARM by the threshold, a beat and a period: 75 s at 1 s steps
# (`contract.pace`), 135 s at the fixed 90 s.
STALLED_EVALUATION_PERIODS = 1
STALLED_BUDGET_S = STALL_THRESHOLD_S + HEARTBEAT_INTERVAL_S + HEARTBEAT_PERIOD_S
DELIVERY_PERIOD_S = 60
DELIVERY_EVALUATION_PERIODS = 3
DELIVERY_DATAPOINTS_TO_ALARM = 2
BACKLOG_THRESHOLD_RECORDS = 500
RESTARTS_PERIOD_S = 60

ALARM_PREFIX = "beacon"
EXPERIMENT_PLACEHOLDER = "${Experiment}"
RUN_PLACEHOLDER = "${Run}"


class RunAlarm(StrEnum):
    SILENT = "silent"
    STALLED = "stalled"
    SLOW = "slow"  # a rank the others wait for (`contract.pace`): StragglerWaitShare, sent once windows are full
    SLOWED = "slowed"  # the whole run slower than its baseline, no rank standing out: StepTimeRatio

    @classmethod
    def notifying(cls) -> tuple[RunAlarm, ...]:
        """The run's alarms that notify the team's topic, and whose ALARM the verdict function answers: the
        composite of what loses metrics (silent, stalled, delivery), and the slow rank's and the slowed run's each on
        its own (a run may be slow for hours, and a composite notifies once: a hang or a lost upload after it would
        say nothing)."""
        return (cls.METRICS_LOST, cls.SLOW, cls.SLOWED)

    @classmethod
    def metric_alarms(cls) -> tuple[RunAlarm, ...]:
        """The run's alarms on one metric each; METRICS_LOST is the composite of them that notifies."""
        return tuple(kind for kind in cls if kind is not cls.METRICS_LOST)

    METRICS_LOST = "metrics-lost"


class TeamAlarm(StrEnum):
    UPLOAD_FAILURES = "upload-failures"
    SPOOL_BACKLOG = "spool-backlog"
    RESTARTS = "restarts"


def run_alarm_prefix(team: str) -> str:
    return f"{ALARM_PREFIX}-{team}-run-"


def alarm_prefix_collision(team: str) -> str | None:
    """Why this team name would let another team's alarm grant match its alarms, or None.

    Team ``a``'s writer manages ``beacon-a-run-*``; a team named ``a-run`` or ``a-run-b`` would have
    alarms inside that pattern. So no hyphen-separated part after the first may be ``run``.
    """
    if "run" in team.split("-")[1:]:
        return f"'run' after a hyphen would put its alarms inside team {team.split('-run')[0]!r}'s run alarms"
    return None


def run_alarm_name(team: str, experiment: str, run: str, kind: RunAlarm) -> str:
    return f"{run_alarm_prefix(team)}{experiment}-{run}-{kind.value}"


def team_alarm_name(team: str, kind: TeamAlarm) -> str:
    return f"{ALARM_PREFIX}-{team}-{kind.value}"


def smoke_min_duration_s(heartbeat_interval_s: float) -> float:
    """How long a smoke run must last for its run alarms to arm and be evaluated at least once:
    the first heartbeat's period closes, and a beat or two follow."""
    return HEARTBEAT_PERIOD_S * 2 + heartbeat_interval_s


def run_alarm_parameter_name(team: str) -> str:
    return f"/beacon/{team}/run-alarm-template"


def render_run_alarms(
    template: str, experiment: str, run: str, *, slow_rank_share: float | None = None
) -> dict[str, Any]:
    """Fill a run-alarm template (JSON from the monitoring stack) for one run; `slow_rank_share`: the run's own (its
    settings, as its preflight record states them), the slow alarm's threshold, so the alarm, rank 0 and the doctor
    hold a rank to one number even where the run was given another than its team file's."""
    validate_id("experiment", experiment)
    validate_id("run", run)
    filled = dict(json.loads(template.replace(EXPERIMENT_PLACEHOLDER, experiment).replace(RUN_PLACEHOLDER, run)))
    slow = f"-{RunAlarm.SLOW.value}"
    for alarm in filled["metric_alarms"] if slow_rank_share is not None else ():
        if alarm["AlarmName"].endswith(slow) and alarm["Threshold"] != slow_rank_share:
            said = f"{alarm['Threshold']:.0%} of each step"
            alarm["AlarmDescription"] = alarm["AlarmDescription"].replace(said, f"{slow_rank_share:.0%} of each step")
            alarm["Threshold"] = slow_rank_share
    return filled


def run_alarms_arm_at(first_heartbeat_at: float) -> float:
    """When a job may create its run alarms: once the period holding its first heartbeat closed.

    The silent alarm treats missing data as breaching; created earlier, it would find only empty
    periods to evaluate and open in ALARM.
    """
    return (math.floor(first_heartbeat_at / HEARTBEAT_PERIOD_S) + 1) * HEARTBEAT_PERIOD_S
