"""The job's own alarms: created from the monitoring stack's template once the first heartbeat
period has closed, deleted on a clean exit. An idle team therefore has no run alarm to sit in ALARM."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from beacon import contract


@dataclass
class RunAlarms:
    cloudwatch: Any
    ssm: Any
    team: str
    experiment: str
    run: str
    slow_rank_share: float | None = None  # the run's own: its slow alarm's threshold (the template's when None)
    armed: bool = False

    def names(self) -> list[str]:
        return [contract.run_alarm_name(self.team, self.experiment, self.run, kind) for kind in contract.RunAlarm]

    def arm(self) -> None:
        parameter = self.ssm.get_parameter(Name=contract.run_alarm_parameter_name(self.team))
        template = parameter["Parameter"]["Value"]
        rendered = contract.render_run_alarms(template, self.experiment, self.run, slow_rank_share=self.slow_rank_share)
        for alarm in rendered["metric_alarms"]:
            self.cloudwatch.put_metric_alarm(**alarm)
        self.cloudwatch.put_composite_alarm(**rendered["composite_alarm"])
        self.armed = True

    def disarm(self) -> None:
        """Delete this run's alarms (composite first: it refers to the others)."""
        names = self.names()
        composite = contract.run_alarm_name(self.team, self.experiment, self.run, contract.RunAlarm.METRICS_LOST)
        self.cloudwatch.delete_alarms(AlarmNames=[composite])
        self.cloudwatch.delete_alarms(AlarmNames=[n for n in names if n != composite])
        self.armed = False
