"""What a run left behind, read back through the same contract the job wrote with."""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from beacon import contract
from beacon.contract.preflight import preflight_document
from beacon.contract.rank_evidence import (
    FLIGHT_RECORDER_PREFIX,
    RankProgress,
    rank_of_file,
    signal_stacks_name,
    stacks_name,
    with_signal_dump,
)
from botocore.exceptions import BotoCoreError, ClientError


@dataclass
class RunEvidence:
    experiment: str
    run: str
    records: list[contract.Record] = field(default_factory=list)
    chunk_keys: list[str] = field(default_factory=list)
    preflights: list[dict[str, Any]] = field(default_factory=list)  # each start that passed: an attempt
    failed_starts: list[dict[str, Any]] = field(default_factory=list)  # each that stopped in its preflight, and why
    final: dict[str, Any] | None = None
    # A final state an earlier attempt wrote, a later attempt having started since (`final` is then None): the
    # status key is rewritten by each attempt's end, so until the running one ends it still holds the last one's.
    superseded_final: dict[str, Any] | None = None
    checkpoints: list[str] = field(default_factory=list)
    tensorboard_files: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # The newest attempt's ranks' evidence (`beacon.evidence.ranks`; uploaded by rank 0 and, where it could not, by
    # the node leaders, `beacon.evidence.node_leader`), merged (`merge_rank_files`): file name -> bytes.
    rank_files: dict[str, bytes] = field(default_factory=dict)
    # Where they came from, comma-separated: `attempt-<k>` (the attempt's end), `attempt-<k>/live-<n>` (a
    # stall's snapshot), `attempt-<k>/node-<g>[/live-<n>]` (a node leader's).
    rank_files_from: str = ""
    rank_file_keys: dict[str, str] = field(default_factory=dict)  # file name -> the S3 key it was read from
    # Read from the tail (`read_run(tail_only=True)`): the indexed chunks' summaries, whose records were not
    # read; `records` then holds the tail's alone. Empty when every chunk was read.
    indexed: list[contract.ChunkSummary] = field(default_factory=list)
    # What did not validate, or contradicts the run, each "<where>: <why>": left out of every verdict, and named.
    # A run's writer can write anything under its prefix (a bug, a compromised container); create-only, forever.
    set_aside: list[str] = field(default_factory=list)

    def ranks(self) -> tuple[list[RankProgress], dict[int, str]]:
        """Every rank's last document, and each rank's stack dumps, from the rank files. A document that does not
        parse, or names a rank outside the run's world (its preflight's), is set aside."""
        documents, stacks, at_signal = [], {}, {}
        world = self.world_size
        for name, body in sorted(self.rank_files.items()):
            if name.startswith("rank-") and name.endswith(".json"):
                where = self.rank_file_keys.get(name, name).split(f"/{contract.RANKS}/", 1)[-1]
                try:
                    document = RankProgress.from_document(body)
                except ValueError as error:
                    self._set_aside(f"{contract.RANKS}/{where}", str(error))
                    continue
                if document.rank != rank_of_file(name):
                    self._set_aside(
                        f"{contract.RANKS}/{where}",
                        f"named rank {rank_of_file(name)}, but its document says rank {document.rank}",
                    )
                    continue
                if world and not (0 <= document.rank < world and document.world_size == world):
                    self._set_aside(
                        f"{contract.RANKS}/{where}",
                        f"rank {document.rank} of {document.world_size}: the run's preflight says {world} rank(s)",
                    )
                    continue
                documents.append(document)
            elif (rank := rank_of_file(name)) is not None and name == stacks_name(rank):
                stacks[rank] = body.decode(errors="replace")
            elif rank is not None and name == signal_stacks_name(rank):
                at_signal[rank] = body.decode(errors="replace")
        for rank, dump in at_signal.items():  # faulthandler's, the moment SIGTERM came (`RankSignal.dump_at_signal`)
            stacks[rank] = with_signal_dump(stacks.get(rank, ""), dump)
        return documents, stacks

    def flight_recorder_dumps(self) -> dict[str, bytes]:
        """Each rank's flight-recorder dump among the rank files, by its key in S3."""
        ranks = f"{contract.run_prefix(self.experiment, self.run)}{contract.RANKS}/{self.rank_files_from}/"
        return {
            self.rank_file_keys.get(name, ranks + name): body
            for name, body in self.rank_files.items()
            if name.startswith(FLIGHT_RECORDER_PREFIX)
        }

    @property
    def history(self) -> contract.History:
        """The live history across the run's attempts; superseded records are kept, and counted apart."""
        return contract.history(self.records)

    @property
    def steps(self) -> list[int]:
        """The steps of the live history: one each, whatever restarts went through them again."""
        return self.history.live_steps

    @property
    def last_step(self) -> int | None:
        """The last step of the live history: the newest attempt's last step (its steps are all live)."""
        if not self.indexed:
            return max(self.steps) if self.records else None
        newest = max(a for a in (*self.attempts_indexed, *(r.attempt for r in self.records)))
        # read_run read every indexed chunk the newest attempt shares with an older one: the summaries left
        # hold its steps alone, or none of its steps
        read = [r.step for r in self.records if r.attempt == newest]
        return max([*read, *(s.last_step for s in self.indexed if s.attempts == (newest,))])

    @property
    def newest_record_at(self) -> tuple[float, int] | None:
        """When the newest record in S3 was logged, and its step (from the index when the tail is empty)."""
        candidates = [(r.wall_time, r.step) for r in self.records]
        candidates += [(s.last_wall_time, s.last_step) for s in self.indexed]
        return max(candidates) if candidates else None

    @property
    def attempts_indexed(self) -> set[int]:
        return {a for s in self.indexed for a in s.attempts}

    @property
    def record_count(self) -> int:
        """Records in S3: the indexed chunks' counts and the records read."""
        return sum(s.records for s in self.indexed) + len(self.records)

    @property
    def numbered(self) -> int:
        """Sequence numbers the spool gave so far, as far as S3 shows (gapless from 0 when nothing is lost)."""
        last = max((s.last_seq for s in self.indexed), default=-1)
        return max(last, max((r.seq for r in self.records), default=-1)) + 1

    @property
    def missing(self) -> int:
        """Sequence numbers below the highest in S3 that S3 does not hold; an indexed chunk holds a run of
        consecutive numbers, so its summary's count is enough."""
        ranges = sorted((s.first_seq, s.last_seq) for s in self.indexed)
        firsts = [first for first, _ in ranges]

        def indexed(seq: int) -> bool:
            at = bisect.bisect_right(firsts, seq) - 1
            return at >= 0 and seq <= ranges[at][1]

        held = sum(s.records for s in self.indexed) + len({r.seq for r in self.records if not indexed(r.seq)})
        return max(0, self.numbered - held)

    @property
    def duplicated(self) -> int:
        """Records of one (attempt, step) beyond the first: never expected."""
        return len(self.history.duplicated)

    @property
    def writer_ranks(self) -> list[int]:
        return sorted({r.rank for r in self.records})

    @property
    def final_state(self) -> str | None:
        """How the run ended (`contract.FinalState`), or None while no final state is written."""
        return None if self.final is None else str(self.final.get("state", contract.FinalState.FINISHED))

    @property
    def finished(self) -> bool:
        return self.final_state == contract.FinalState.FINISHED

    @property
    def preflight(self) -> dict[str, Any] | None:
        return self.preflights[-1] if self.preflights else None

    @property
    def world_size(self) -> int:
        """The run's ranks, as its newest preflight says (0: not known)."""
        value = (self.preflight or {}).get("world_size", 0)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    def _set_aside(self, where: str, why: str) -> None:
        entry = f"{where}: {why}"
        if entry not in self.set_aside:
            self.set_aside.append(entry)


@dataclass
class Delivery:
    """What has reached S3 so far, read incrementally while the job runs (each chunk once), for the
    progress line; the verdict takes read_run's reading once the job ended."""

    s3: Any
    bucket: str
    experiment: str
    run: str
    records: int = 0
    last_step: int | None = None
    finished: bool = False
    final_state: str = ""
    _read: set[str] = field(default_factory=set)

    def poll(self) -> Delivery:
        prefix = f"{contract.run_prefix(self.experiment, self.run)}{contract.EVENTS}/"
        try:
            pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
            keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
            for key in sorted(set(keys) - self._read):
                body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
                steps = [record.step for record in contract.records_of(body)]
                self.records += len(steps)
                self.last_step = max([*steps, *([self.last_step] if self.last_step is not None else [])])
                self._read.add(key)
            final = self.s3.get_object(Bucket=self.bucket, Key=contract.final_status_key(self.experiment, self.run))
            self.final_state = str(json.loads(final["Body"].read()).get("state", contract.FinalState.FINISHED))
            self.finished = True
        except (ClientError, BotoCoreError):
            pass  # not there yet, or a transient error: the next poll tries again
        return self

    def describe(self) -> str:
        step = "-" if self.last_step is None else str(self.last_step)
        ended = f", final state {self.final_state}" if self.finished else ""
        return f"last step {step}, {self.records} records in S3{ended}"


def _keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(item["Key"] for item in page.get("Contents", []))
    return sorted(keys)


def _read(s3: Any, bucket: str, key: str) -> bytes:
    return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


# A record line's counts, JSON integers: the reader counts and orders by them (`"seq": "7"` or 7.5 is no number of
# the spool's, though `int()` would take it)
RECORD_COUNTS = ("seq", "step", "attempt", "rank")


def _records(body: bytes, where: str, evidence: RunEvidence, after: int | None = None) -> list[contract.Record]:
    """A chunk's records, line by line: a line that is not a record is set aside, its neighbours kept. The spool
    numbers a chunk's records one after another, from the number after the chunk before it (`after`: that chunk's
    last, when it was read or indexed; else the chunk's lowest): a line numbered out of that run is set aside, not
    believed (a forged `seq` of 10^18 would read as that many records missing)."""
    read = []
    for number, line in enumerate(body.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            if problem := _not_counts(json.loads(line)):
                evidence._set_aside(f"{where} line {number}", f"not a record ({problem})")
                continue
            record = contract.Record.from_line(line)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            evidence._set_aside(f"{where} line {number}", f"not a record ({type(error).__name__}: {error})")
            continue
        if (record.experiment, record.run) != (evidence.experiment, evidence.run):
            evidence._set_aside(f"{where} line {number}", f"a record of {record.experiment}/{record.run}")
            continue
        read.append((number, record))
    expected = after + 1 if after is not None else min((r.seq for _, r in read), default=0)
    found = []
    for number, record in read:
        if record.seq != expected:
            evidence._set_aside(
                f"{where} line {number}",
                f"seq {record.seq} where the spool's numbering is at {expected} (it numbers records one after another)",
            )
            continue
        found.append(record)
        expected += 1
    return found


def _not_counts(line: object) -> str:
    """What is wrong with a record line's counts ("" when nothing): each a JSON integer, its `seq` not negative."""
    if not isinstance(line, dict):
        return f"not a JSON object but {type(line).__name__}"
    for name in RECORD_COUNTS:
        value = line.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{name}: {value!r} is not an integer"
    return f"seq: {line['seq']} is negative" if line.get("seq", 0) < 0 else ""


NUMBER = (int, float)


def _document(body: bytes, where: str, evidence: RunEvidence, parse: Callable[[bytes], Any]) -> dict[str, Any] | None:
    """A document through its contract parser (a preflight, a final state), or None and set aside, named."""
    try:
        return dict(parse(body))
    except ValueError as error:
        evidence._set_aside(where, str(error))
        return None


def read_run(s3: Any, bucket: str, experiment: str, run: str, *, tail_only: bool = False) -> RunEvidence:
    """Everything the run left in S3. `tail_only` (the doctor, on a run of any length): the index's
    summaries stand for the chunks they cover, and only the chunks after them (the tail) are read."""
    evidence = RunEvidence(experiment, run)
    prefix = contract.run_prefix(experiment, run)
    try:
        keys = _keys(s3, bucket, prefix)
    except (ClientError, BotoCoreError) as error:
        evidence.errors.append(f"s3:ListBucket s3://{bucket}/{prefix}: {describe_error(error)}")
        return evidence
    if tail_only:
        evidence.indexed = _indexed(s3, bucket, prefix, keys, evidence._set_aside)
    skipped = {contract.events_key(experiment, run, s.chunk) for s in evidence.indexed}
    last_seq = {s.chunk: s.last_seq for s in evidence.indexed}  # each chunk's last number, indexed or read
    for key in keys:
        kind = key.removeprefix(prefix).split("/", 1)[0]
        where = key.removeprefix(prefix)
        if kind == contract.EVENTS:
            evidence.chunk_keys.append(key)
            if key not in skipped:
                chunk = contract.chunk_of_events_key(key)
                after = last_seq.get(chunk - 1) if chunk is not None else None
                records = _records(_read(s3, bucket, key), where, evidence, after)
                evidence.records.extend(records)
                if chunk is not None and records:
                    last_seq[chunk] = records[-1].seq
        elif kind == contract.PREFLIGHT:
            preflight = _document(_read(s3, bucket, key), where, evidence, preflight_document)
            if preflight is not None:
                (evidence.failed_starts if preflight.get("failed") else evidence.preflights).append(preflight)
        elif kind == contract.STATUS and key == contract.final_status_key(experiment, run):
            evidence.final = _document(_read(s3, bucket, key), where, evidence, contract.final_state_document)
        elif kind == contract.CHECKPOINTS:
            evidence.checkpoints.append(key)
        elif kind == contract.TENSORBOARD:
            evidence.tensorboard_files.append(key)
    if evidence.final is not None and final_superseded(evidence.final, evidence):
        evidence.superseded_final, evidence.final = evidence.final, None
    sources = rank_sources(prefix, keys)
    merged = merge_rank_files(
        [{key.rsplit("/", 1)[1]: (key, _read(s3, bucket, key)) for key in k} for k, _ in sources], evidence._set_aside
    )
    evidence.rank_files = {name: body for name, (_, body) in merged.items()}
    evidence.rank_file_keys = {name: key for name, (key, _) in merged.items()}
    evidence.rank_files_from = ", ".join(where for _, where in sources if where)
    return evidence


def final_superseded(final: dict[str, Any], evidence: RunEvidence) -> bool:
    """`contract.final_state_superseded` on what the run left: its records' and index's attempts, and when each
    attempt's preflight started."""
    started = []
    for preflight in evidence.preflights:
        try:
            started.append(datetime.fromisoformat(str(preflight.get("started_at"))).timestamp())
        except ValueError:
            continue
    attempts = {r.attempt for r in evidence.records} | evidence.attempts_indexed
    return contract.final_state_superseded(final, attempts=attempts, attempts_started_at=started)


def _indexed(
    s3: Any, bucket: str, prefix: str, keys: list[str], set_aside: Callable[[str, str], None] | None = None
) -> list[contract.ChunkSummary]:
    """The summaries of the index documents among `keys`, less the chunks a reader must still read: an
    unreadable document's, and any the newest attempt shares with an older one (its last step is then
    not in the summary). Chunks in S3 that no summary covers are the tail."""
    summaries: list[contract.ChunkSummary] = []
    for key in keys:
        if key.removeprefix(prefix).split("/", 1)[0] == contract.INDEX:
            try:
                summaries.extend(contract.summaries_of(_read(s3, bucket, key)))
            except (ClientError, BotoCoreError):
                continue  # its chunks are read instead
            except (ValueError, KeyError, TypeError) as error:  # as for a bad evidence file: named
                if set_aside is not None:
                    set_aside(key.removeprefix(prefix), f"an index that is not one ({error})")
                continue  # its chunks are read instead
    newest = max((a for s in summaries for a in s.attempts), default=0)
    return [s for s in summaries if not (newest in s.attempts and len(s.attempts) > 1)]


def describe_error(error: ClientError | BotoCoreError) -> str:
    """An S3 error as its code and message (`NoSuchBucket: The specified bucket does not exist`)."""
    if isinstance(error, ClientError):
        detail = error.response.get("Error", {})
        return f"{detail.get('Code', 'error')}: {detail.get('Message', '')}".rstrip(": ")
    return str(error)


def rank_keys(prefix: str, keys: list[str]) -> tuple[list[str], str]:
    """Rank 0's upload of the ranks' evidence to read, chosen from the run's one listing, and where it is
    (`attempt-<k>` or `attempt-<k>/live-<n>`): the newest attempt's end-of-attempt files when it has them;
    else that attempt's newest live snapshot (rank 0 uploads one while a rank stalls), the newest complete
    one when there is one (a snapshot still uploading lacks files). The node leaders' uploads beside it
    (`attempt-<k>/node-<g>/`, the same layout inside) are `rank_sources`'."""
    ranks = f"{prefix}{contract.RANKS}/"
    paths = [key.removeprefix(ranks).split("/") for key in keys if key.startswith(ranks)]
    if not paths:
        return [], ""
    newest = max(path[0] for path in paths)  # attempt-<k>, zero-padded
    return _uploaders_choice(ranks, newest, [path[1:] for path in paths if path[0] == newest])


def rank_sources(prefix: str, keys: list[str]) -> list[tuple[list[str], str]]:
    """Each uploader's choice (as `rank_keys`) in the newest attempt: rank 0's, then each node leader's,
    those that uploaded anything. A node leader uploads when rank 0 could not: it stopped, or the ranks
    directory is node-local (`beacon.evidence.node_leader`)."""
    ranks = f"{prefix}{contract.RANKS}/"
    paths = [key.removeprefix(ranks).split("/") for key in keys if key.startswith(ranks)]
    if not paths:
        return []
    newest = max(path[0] for path in paths)
    ours = [path[1:] for path in paths if path[0] == newest]
    nodes = sorted({path[0] for path in ours if len(path) > 1 and path[0].startswith(f"{contract.NODE}-")})
    chosen = [_uploaders_choice(ranks, newest, ours)]
    for node in nodes:
        chosen.append(_uploaders_choice(ranks, f"{newest}/{node}", [path[1:] for path in ours if path[0] == node]))
    return [(k, where) for k, where in chosen if k]


def _uploaders_choice(ranks: str, base: str, paths: list[list[str]]) -> tuple[list[str], str]:
    """One uploader's files under `base` (paths relative to it): its end-of-attempt files, else its newest
    complete live snapshot, else its newest one."""
    final = [path for path in paths if len(path) == 1]
    live = [path for path in paths if len(path) == 2 and path[0].startswith(f"{contract.LIVE_SNAPSHOT}-")]
    if final or not live:
        return [f"{ranks}{base}/{path[0]}" for path in final], base if final else ""
    complete = {path[0] for path in live if path[1] == contract.LIVE_SNAPSHOT_COMPLETE}
    snapshot = max(complete or {path[0] for path in live})  # live-<n>, zero-padded
    chosen = [path for path in live if path[0] == snapshot and path[1] != contract.LIVE_SNAPSHOT_COMPLETE]
    return [f"{ranks}{base}/{'/'.join(path)}" for path in chosen], f"{base}/{snapshot}"


def merge_rank_files(
    sources: list[dict[str, tuple[str, bytes]]], set_aside: Callable[[str, str], None] | None = None
) -> dict[str, tuple[str, bytes]]:
    """The uploads of one attempt (rank 0's first; file name -> (key, body)) as one set: each rank's files
    from the upload that holds its newest document (by the time it was written; rank 0's on a tie), so a
    rank's document and stacks come from one moment; a file of a rank no document names, from the first.
    A document that does not parse is told to `set_aside` (its key from the ranks folder on, why)."""
    newest: dict[int, tuple[float, int]] = {}  # rank -> (its document's wall time, the upload's index)
    for index, files in enumerate(sources):
        for name, (key, body) in files.items():
            rank = rank_of_file(name)
            if rank is None or not name.startswith("rank-"):
                continue
            try:
                written = RankProgress.from_document(body).wall_time
            except ValueError as error:
                if set_aside is not None:
                    set_aside(f"{contract.RANKS}/{key.split(f'/{contract.RANKS}/', 1)[-1]}", str(error))
                continue
            if rank not in newest or written > newest[rank][0]:
                newest[rank] = (written, index)
    merged: dict[str, tuple[str, bytes]] = {}
    for index, files in enumerate(sources):
        for name, item in files.items():
            rank = rank_of_file(name)
            owner = newest[rank][1] if rank in newest else None
            if owner == index or (owner is None and name not in merged):
                merged[name] = item
    return merged


class MetricsReadOnce:
    """A CloudWatch client that asks each metric question once: in one command, verification and the
    doctor read the same series (the heartbeat three times, progress age twice) from one answer. The
    window's ends are not part of the question: the first answer serves the command."""

    def __init__(self, cloudwatch: Any) -> None:
        self._cloudwatch = cloudwatch
        self._answers: dict[str, Any] = {}
        self.asked = 0  # questions sent to CloudWatch

    def get_metric_statistics(self, **question: Any) -> Any:
        key = json.dumps({k: v for k, v in question.items() if k not in ("StartTime", "EndTime")}, sort_keys=True)
        if key not in self._answers:
            self._answers[key] = self._cloudwatch.get_metric_statistics(**question)
            self.asked += 1
        return self._answers[key]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cloudwatch, name)  # alarms and the rest: asked each time


@dataclass(frozen=True)
class Sample:
    at: datetime
    value: float


# GetMetricStatistics refuses a request for more than 1,440 datapoints (InvalidParameterCombination); a
# high-resolution period is 1, 5, 10, 20 or 30 s, any other a multiple of 60 (the API reference).
MAX_DATAPOINTS = 1440
HIGH_RESOLUTION_PERIODS = (1, 5, 10, 20, 30)


def finest_period(window_s: float, *, high_resolution: bool) -> int:
    """The shortest period CloudWatch accepts that answers `window_s` in one request."""
    for period in HIGH_RESOLUTION_PERIODS if high_resolution else ():
        if math.ceil(window_s / period) <= MAX_DATAPOINTS:
            return period
    return 60 * max(1, math.ceil(window_s / 60 / MAX_DATAPOINTS))


def metric_samples(
    cloudwatch: Any,
    metric: contract.Metric,
    dimensions: dict[str, str],
    *,
    statistic: str,
    minutes: int = 30,
    period: int | None = None,
    now: datetime | None = None,
) -> list[Sample]:
    """Datapoints of one metric, oldest first. By default the finest period the window allows: a high-resolution
    metric's 1 s (its data comes back raw) for a window up to 1,440 s, 5 s for the default 30 minutes; 60 s for
    standard ones."""
    now = now or datetime.now(UTC)
    start, end = now - timedelta(minutes=minutes), now + timedelta(seconds=5)
    answer = cloudwatch.get_metric_statistics(
        Namespace=contract.metric_namespace(dimensions[contract.Dim.TEAM.value]),
        MetricName=metric.name,
        Dimensions=[{"Name": k, "Value": v} for k, v in dimensions.items()],
        StartTime=start,
        EndTime=end,
        Period=period or finest_period((end - start).total_seconds(), high_resolution=metric.high_resolution),
        Statistics=[statistic],
    )
    return sorted(
        (Sample(point["Timestamp"].astimezone(UTC), float(point[statistic])) for point in answer["Datapoints"]),
        key=lambda sample: sample.at,
    )


def alarm_states(cloudwatch: Any, names_prefix: str) -> dict[str, str]:
    answer = cloudwatch.describe_alarms(AlarmNamePrefix=names_prefix)
    return {a["AlarmName"]: a["StateValue"] for a in [*answer["MetricAlarms"], *answer.get("CompositeAlarms", [])]}
