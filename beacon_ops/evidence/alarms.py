"""An evaluator of the alarm semantics Beacon's alarms use, driven by synthesized definitions.

moto stores alarms but never evaluates them, so the two-minute claim is proven here: period
alignment, the statistic per period, evaluation periods, datapoints to alarm, treat-missing-data,
composite rules made of ALARM()/OK() with AND, OR, NOT and parentheses, and one-series Metrics
Insights queries (SELECT <stat>(metric) FROM SCHEMA(...) WHERE dim = 'value' AND ...). Nothing
more: this is not a general CloudWatch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from beacon.contract import render_run_alarms

from beacon_ops.templates import Resolver, Template, shape_resolver

ALARM, OK, INSUFFICIENT = "ALARM", "OK", "INSUFFICIENT_DATA"

# (namespace, metric name, frozenset of dimension pairs) -> [(time, value), ...]
SeriesKey = tuple[str, str, frozenset[tuple[str, str]]]
Samples = Mapping[SeriesKey, list[tuple[float, float]]]

COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    "GreaterThanThreshold": lambda v, t: v > t,
    "GreaterThanOrEqualToThreshold": lambda v, t: v >= t,
    "LessThanThreshold": lambda v, t: v < t,
    "LessThanOrEqualToThreshold": lambda v, t: v <= t,
}
STATISTICS: dict[str, Callable[[list[float]], float]] = {
    "SampleCount": lambda xs: float(len(xs)),
    "Sum": lambda xs: float(sum(xs)),
    "Average": lambda xs: float(sum(xs) / len(xs)),
    "Maximum": lambda xs: float(max(xs)),
    "Minimum": lambda xs: float(min(xs)),
}


# Metrics Insights aggregates over every matching series; over the union of their values they equal these.
QUERY_STATISTICS = {"MAX": "Maximum", "MIN": "Minimum", "SUM": "Sum", "AVG": "Average", "COUNT": "SampleCount"}
_QUERY = re.compile(
    r"SELECT\s+(?P<stat>[A-Z]+)\((?P<metric>\w+)\)\s+FROM\s+SCHEMA\(\s*\"?(?P<namespace>[^\",]+)\"?"
    r"(?P<dimensions>(?:\s*,\s*\w+)*)\s*\)(?:\s+WHERE\s+(?P<where>.+))?",
    re.IGNORECASE,
)
_CONDITION = re.compile(r"(\w+)\s*=\s*'([^']*)'")


@dataclass(frozen=True)
class MetricsQuery:
    """A Metrics Insights query without GROUP BY: one statistic over every series of a schema."""

    statistic: str
    namespace: str
    metric_name: str
    schema: frozenset[str]
    filters: dict[str, str]

    @classmethod
    def parse(cls, expression: str) -> MetricsQuery:
        match = _QUERY.fullmatch(expression.strip())
        if not match or match["stat"].upper() not in QUERY_STATISTICS:
            raise ValueError(f"not a Metrics Insights query Beacon evaluates: {expression!r}")
        conditions = re.split(r"\s+AND\s+", match["where"], flags=re.IGNORECASE) if match["where"] else []
        filters = {}
        for condition in conditions:
            found = _CONDITION.fullmatch(condition.strip())
            if not found:
                raise ValueError(f"unsupported condition {condition!r} in {expression!r}")
            filters[found[1]] = found[2]
        return cls(
            statistic=QUERY_STATISTICS[match["stat"].upper()],
            namespace=match["namespace"],
            metric_name=match["metric"],
            schema=frozenset(d.strip() for d in match["dimensions"].split(",") if d.strip()),
            filters=filters,
        )

    def matches(self, key: SeriesKey) -> bool:
        namespace, metric_name, pairs = key
        dimensions = dict(pairs)
        return (
            (namespace, metric_name) == (self.namespace, self.metric_name)
            and set(dimensions) == self.schema
            and all(dimensions.get(k) == v for k, v in self.filters.items())
        )


def series_key(namespace: str, metric_name: str, dimensions: Mapping[str, str]) -> SeriesKey:
    return (namespace, metric_name, frozenset(dimensions.items()))


@dataclass(frozen=True)
class MetricAlarm:
    name: str
    namespace: str
    metric_name: str
    dimensions: dict[str, str]
    statistic: str
    period: int
    evaluation_periods: int
    datapoints_to_alarm: int
    threshold: float
    comparison: str
    treat_missing: str
    query: MetricsQuery | None = field(default=None)

    @classmethod
    def from_definition(cls, definition: Mapping[str, Any]) -> MetricAlarm:
        """From a template's AWS::CloudWatch::Alarm properties or PutMetricAlarm arguments."""
        if definition.get("Metrics"):  # describe_alarms returns an empty list for plain alarms
            return cls._from_query(definition)
        comparison = str(definition["ComparisonOperator"])
        statistic = str(definition["Statistic"])
        if comparison not in COMPARISONS or statistic not in STATISTICS:
            raise ValueError(f"{definition.get('AlarmName')}: unsupported {comparison} / {statistic}")
        evaluation_periods = int(definition["EvaluationPeriods"])
        return cls(
            name=str(definition["AlarmName"]),
            namespace=str(definition["Namespace"]),
            metric_name=str(definition["MetricName"]),
            dimensions={d["Name"]: d["Value"] for d in definition.get("Dimensions", [])},
            statistic=statistic,
            period=int(definition["Period"]),
            evaluation_periods=evaluation_periods,
            datapoints_to_alarm=int(definition.get("DatapointsToAlarm", evaluation_periods)),
            threshold=float(definition["Threshold"]),
            comparison=comparison,
            treat_missing=str(definition.get("TreatMissingData", "missing")),
        )

    @classmethod
    def _from_query(cls, definition: Mapping[str, Any]) -> MetricAlarm:
        name = definition.get("AlarmName")
        metrics = list(definition["Metrics"])
        expression = str(metrics[0].get("Expression", "")) if len(metrics) == 1 else ""
        if not expression.lstrip().upper().startswith("SELECT"):
            raise ValueError(f"{name}: metric-math alarms are not used by Beacon (only one Metrics Insights query)")
        query = MetricsQuery.parse(expression)
        comparison = str(definition["ComparisonOperator"])
        if comparison not in COMPARISONS:
            raise ValueError(f"{name}: unsupported {comparison}")
        evaluation_periods = int(definition["EvaluationPeriods"])
        return cls(
            name=str(name),
            namespace=query.namespace,
            metric_name=query.metric_name,
            dimensions=dict(query.filters),
            statistic=query.statistic,
            period=int(metrics[0]["Period"]),
            evaluation_periods=evaluation_periods,
            datapoints_to_alarm=int(definition.get("DatapointsToAlarm", evaluation_periods)),
            threshold=float(definition["Threshold"]),
            comparison=comparison,
            treat_missing=str(definition.get("TreatMissingData", "missing")),
            query=query,
        )

    @property
    def key(self) -> SeriesKey:
        return series_key(self.namespace, self.metric_name, self.dimensions)

    def _series(self, samples: Samples) -> list[tuple[float, float]]:
        if self.query is None:
            return list(samples.get(self.key, []))
        return [point for key, points in samples.items() if self.query.matches(key) for point in points]

    def datapoints(self, samples: Samples, at: float) -> list[float | None]:
        """The last `evaluation_periods` complete periods before `at`, oldest first; None = missing."""
        last_end = math.floor(at / self.period) * self.period
        points: list[float | None] = []
        series = self._series(samples)
        for index in range(self.evaluation_periods, 0, -1):
            end = last_end - (index - 1) * self.period
            start = end - self.period
            values = [v for t, v in series if start <= t < end]
            points.append(STATISTICS[self.statistic](values) if values else None)
        return points

    def state(self, samples: Samples, at: float, previous: str = OK) -> str:
        points = self.datapoints(samples, at)
        present = [p for p in points if p is not None]
        if not present:
            if self.treat_missing == "breaching":
                return ALARM if len(points) >= self.datapoints_to_alarm else OK
            if self.treat_missing == "notBreaching":
                return OK
            return previous if self.treat_missing == "ignore" else INSUFFICIENT
        breaching = sum(1 for p in present if COMPARISONS[self.comparison](p, self.threshold))
        if self.treat_missing == "breaching":
            breaching += len(points) - len(present)
        return ALARM if breaching >= self.datapoints_to_alarm else OK


_TOKEN = re.compile(r'\s*(?:(ALARM|OK|INSUFFICIENT_DATA)\(\s*"([^"]+)"\s*\)|(AND|OR|NOT|TRUE|FALSE)|(\()|(\)))')


@dataclass(frozen=True)
class CompositeAlarm:
    name: str
    rule: str

    @classmethod
    def from_definition(cls, definition: Mapping[str, Any]) -> CompositeAlarm:
        return cls(name=str(definition["AlarmName"]), rule=str(definition["AlarmRule"]))

    def members(self) -> list[str]:
        return [m.group(2) for m in _TOKEN.finditer(self.rule) if m.group(2)]

    def state(self, member_states: Mapping[str, str]) -> str:
        tokens = self._tokens()
        position = 0

        def expression() -> bool:
            nonlocal position
            value = term()
            while position < len(tokens) and tokens[position] == ("op", "OR"):
                position += 1
                value = term() or value
            return value

        def term() -> bool:
            nonlocal position
            value = factor()
            while position < len(tokens) and tokens[position] == ("op", "AND"):
                position += 1
                value = factor() and value
            return value

        def factor() -> bool:
            nonlocal position
            kind, text = tokens[position]
            position += 1
            if (kind, text) == ("op", "NOT"):
                return not factor()
            if kind == "(":
                value = expression()
                position += 1  # the closing parenthesis
                return value
            if kind == "op":
                return text == "TRUE"
            wanted, name = text.split(":", 1)
            return member_states.get(name, INSUFFICIENT) == wanted

        return ALARM if expression() else OK

    def _tokens(self) -> list[tuple[str, str]]:
        tokens: list[tuple[str, str]] = []
        position = 0
        rule = self.rule.strip()
        while position < len(rule):
            match = _TOKEN.match(rule, position)
            if not match:
                raise ValueError(f"{self.name}: cannot parse alarm rule at {rule[position:]!r}")
            if match.group(1):
                tokens.append(("state", f"{match.group(1)}:{match.group(2)}"))
            elif match.group(3):
                tokens.append(("op", match.group(3)))
            else:
                tokens.append(("(" if match.group(4) else ")", ""))
            position = match.end()
        return tokens


@dataclass
class AlarmSet:
    """Metric alarms and composites that exist together, evaluated as CloudWatch would."""

    metric_alarms: dict[str, MetricAlarm]
    composites: dict[str, CompositeAlarm]

    @classmethod
    def from_definitions(
        cls, metric_alarms: Iterable[Mapping[str, Any]], composites: Iterable[Mapping[str, Any]] = ()
    ) -> AlarmSet:
        metrics = {a.name: a for a in map(MetricAlarm.from_definition, metric_alarms)}
        return cls(metrics, {c.name: c for c in map(CompositeAlarm.from_definition, composites)})

    def states(self, samples: Samples, at: float) -> dict[str, str]:
        states = {name: alarm.state(samples, at) for name, alarm in self.metric_alarms.items()}
        for name, composite in self.composites.items():
            states[name] = composite.state(states)
        return states

    def first_alarm(self, name: str, samples: Samples, start: float, until: float) -> float | None:
        """The first evaluation time in [start, until] at which `name` is in ALARM."""
        step = min((a.period for a in self.metric_alarms.values()), default=60)
        at = math.ceil(start / step) * step
        while at <= until:
            if self.states(samples, at)[name] == ALARM:
                return at
            at += step
        return None

    def ever_in_alarm(self, samples: Samples, start: float, until: float) -> dict[str, bool]:
        return {name: self.first_alarm(name, samples, start, until) is not None for name in self.names}

    @property
    def names(self) -> list[str]:
        return [*self.metric_alarms, *self.composites]


# --- definitions from the synthesized monitoring template ---------------------------------
def team_alarm_definitions(monitoring: Template) -> list[dict[str, Any]]:
    return [dict(r["Properties"]) for r in monitoring.of_type("AWS::CloudWatch::Alarm").values()]


def run_alarm_template_text(monitoring: Template, resolver: Resolver | None = None) -> str:
    """The SSM parameter's value, with the topic ARN resolved (or left as a marker)."""
    _, parameter = monitoring.one_of_type("AWS::SSM::Parameter")
    resolver = resolver or shape_resolver()
    return str(resolver.resolve(parameter["Properties"]["Value"]))


def run_alarm_definitions(
    monitoring: Template, experiment: str, run: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rendered = render_run_alarms(run_alarm_template_text(monitoring), experiment, run)
    return list(rendered["metric_alarms"]), dict(rendered["composite_alarm"])


def alarm_set_for_run(monitoring: Template, experiment: str, run: str) -> AlarmSet:
    """Team alarms plus one run's alarms, as they exist while that run is live."""
    metric_alarms, composite = run_alarm_definitions(monitoring, experiment, run)
    return AlarmSet.from_definitions([*team_alarm_definitions(monitoring), *metric_alarms], [composite])
