"""The MLflow mirror: `MlflowClient.log_batch` with each record's own step and wall time.

The MLflow run is found by a tag holding Beacon's experiment/run id, so every start of a Beacon run
feeds the same MLflow run. Each batch also sets a tag with the last sequence number it carries:
after a crash between a send and the cursor write, `open` reads it and nothing is sent twice.
MLflow's SQL store writes a batch's metrics before its tags and ignores a point it already holds
(same key, step, timestamp and value), so even a server dying between the two re-sends nothing
that shows twice. `mlflow` is imported only here, when the mirror opens.

Across restarts: MLflow cannot take points back, so a restart's pass over steps an earlier attempt logged
adds its values beside the earlier ones (both show at those steps), and the run gets a tag per superseded
range, `beacon.superseded.attempt-00000 = 10-14`, with `beacon.last` (attempt:step) to carry it over.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Sequence
from typing import TYPE_CHECKING

from beacon.contract import FinalState, Record
from beacon.sinks.mirrors import History, RunInfo

if TYPE_CHECKING:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

log = logging.getLogger("beacon.mirrors.mlflow")

RUN_TAG = "beacon.run"  # <experiment>/<run>: how a restart finds its MLflow run
SEQ_TAG = "beacon.mirrored_seq"  # the last sequence number MLflow holds, set with the metrics
TEAM_TAG = "beacon.team"
LAST_TAG = "beacon.last"  # <attempt>:<step> of the last record MLflow holds
SUPERSEDED_TAG = "beacon.superseded."  # + attempt-<k>: the steps of attempt k a restart went through again
# log_batch takes at most 1000 entities (metrics + tags) per request; a few tags ride along.
MAX_METRICS_PER_REQUEST = 960
STATUS = {FinalState.FINISHED: "FINISHED", FinalState.FAILED: "FAILED", FinalState.PREEMPTED: "KILLED"}


def mlflow_accepts(name: str) -> bool:
    """MLflow refuses a metric name that would resolve to another as a path ("a//b", "a/", "./a")."""
    normal = posixpath.normpath(name)
    return normal == name and normal != "." and not normal.startswith(("..", "/"))


class MlflowMirror:
    name = "mlflow"

    def __init__(self, tracking_uri: str, experiment: str) -> None:
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self._client: MlflowClient | None = None
        self._run_id = ""
        self._refused: set[str] = set()
        self._history = History()

    def open(self, run: RunInfo) -> int:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.tracking_uri)
        experiment = client.get_experiment_by_name(self.experiment)
        experiment_id = experiment.experiment_id if experiment is not None else self._create_experiment(client)
        identity = f"{run.experiment}/{run.run}"
        found = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{identity}'", max_results=1)
        if found:
            self._run_id = found[0].info.run_id
            tags = found[0].data.tags
            held = int(tags.get(SEQ_TAG, "-1"))
            attempt, _, step = tags.get(LAST_TAG, "").partition(":")
            superseded = {k.removeprefix(SUPERSEDED_TAG): v for k, v in tags.items() if k.startswith(SUPERSEDED_TAG)}
            last = (int(attempt), int(step)) if attempt.isdigit() and step.lstrip("-").isdigit() else None
            self._history = History(last, superseded)
            client.update_run(self._run_id, status="RUNNING")  # this start of the run is running
            log.info("mirroring to MLflow run %s, which holds records through seq %d", self._run_id, held)
        else:
            tags = {RUN_TAG: identity, TEAM_TAG: run.team}
            self._run_id = client.create_run(experiment_id, run_name=run.run, tags=tags).info.run_id
            held = -1
            log.info("mirroring to a new MLflow run %s in experiment %r", self._run_id, self.experiment)
        self._client = client
        return held

    def _create_experiment(self, client: MlflowClient) -> str:
        from mlflow.exceptions import MlflowException

        try:
            return client.create_experiment(self.experiment)
        except MlflowException:  # created meanwhile by another run of the team
            existing = client.get_experiment_by_name(self.experiment)
            if existing is None:
                raise
            return str(existing.experiment_id)

    def send(self, records: Sequence[Record]) -> None:
        from mlflow.entities import Metric

        # Where the run stands once these records are in, kept batch by batch as MLflow takes them.
        history = History(self._history.last, self._history.superseded)
        batch: list[Metric] = []
        complete: int | None = None  # the last record whose every metric is in `batch`
        through = self._history.last  # its (attempt, step)
        for record in records:
            if history.take(record):
                log.info("attempt %d goes through steps from %d again: %s", record.attempt, record.step,
                         history.superseded)  # fmt: skip
            timestamp = int(record.wall_time * 1000)
            for name, value in record.metrics.items():
                if not mlflow_accepts(name):
                    self._refuse(name)
                    continue
                if len(batch) == MAX_METRICS_PER_REQUEST:
                    self._log_batch(batch, complete, through, history)
                    batch, complete = [], None
                batch.append(Metric(name, value, timestamp, record.step))
            complete, through = record.seq, (record.attempt, record.step)
        self._log_batch(batch, complete, through, history)

    def _log_batch(
        self, metrics: list[Metric], seq: int | None, through: tuple[int, int] | None, history: History
    ) -> None:
        from mlflow.entities import RunTag

        if not metrics and seq is None:
            return
        tags = [RunTag(SEQ_TAG, str(seq))] if seq is not None else []
        if seq is not None and through is not None:
            tags.append(RunTag(LAST_TAG, f"{through[0]}:{through[1]}"))
        new = {k: v for k, v in history.superseded.items() if self._history.superseded.get(k) != v}
        tags += [RunTag(SUPERSEDED_TAG + k, v) for k, v in new.items()]  # a restart's range, once
        self._opened().log_batch(self._run_id, metrics=metrics, tags=tags)
        self._history.superseded.update(new)  # MLflow holds them now
        if seq is not None:
            self._history.last = through

    def _refuse(self, name: str) -> None:
        if name not in self._refused:
            self._refused.add(name)
            log.warning("metric %r is not mirrored to MLflow: MLflow refuses the name (S3 keeps it)", name)

    def held_through(self, record: Record) -> None:
        self._history.held_through(record)

    def close(self, state: FinalState) -> None:
        self._opened().set_terminated(self._run_id, status=STATUS[state])

    def _opened(self) -> MlflowClient:
        if self._client is None:
            raise RuntimeError("the MLflow mirror is not open")
        return self._client
