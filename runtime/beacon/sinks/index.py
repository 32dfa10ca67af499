"""The run's index: a create-only document per `contract.INDEX_GROUP` event chunks, saying what each
holds (sequence numbers, steps, attempts, times). A reader of a long run lists the few index documents
and the chunks after the last one (the tail), instead of listing and reading every chunk.

The uploader writes a group's document once S3 acknowledged every chunk of it. A chunk acknowledged
by an earlier process of the run (before a restart) is summarised from S3, once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from beacon import contract
from beacon.contract import ChunkSummary
from beacon.create_only import put_create_only

log = logging.getLogger(__name__)


def group_of(chunk: int) -> int:
    return chunk // contract.INDEX_GROUP


def chunks_of(group: int) -> range:
    return range(group * contract.INDEX_GROUP, (group + 1) * contract.INDEX_GROUP)


class IndexWriter:
    """Used from the uploader thread alone."""

    def __init__(self, s3: Any, *, bucket: str, experiment: str, run: str) -> None:
        self.s3, self.bucket, self.experiment, self.run = s3, bucket, experiment, run
        self._summaries: dict[int, ChunkSummary] = {}
        self._complete: set[int] = set()  # groups whose last chunk was acknowledged, index not yet written
        self.written: list[int] = []

    def acknowledged(self, summary: ChunkSummary) -> None:
        """S3 holds this chunk: remember what it holds, and write its group's index once the group is whole."""
        self._summaries[summary.chunk] = summary
        if summary.chunk == chunks_of(group_of(summary.chunk))[-1]:
            self._complete.add(group_of(summary.chunk))
        for group in sorted(self._complete):
            if self._write(group):
                self._complete.discard(group)

    def _write(self, group: int) -> bool:
        key = contract.index_key(self.experiment, self.run, group)
        try:
            summaries = [self._summaries.get(n) or self._summary_from_s3(n) for n in chunks_of(group)]
        except (ClientError, BotoCoreError, OSError) as error:
            log.warning("index s3://%s/%s not written yet: %s", self.bucket, key, error)
            return False
        # Written before counts as written: by this process's retry, or by an earlier process of the run.
        outcome = put_create_only(
            self.s3, bucket=self.bucket, key=key, body=contract.index_document(group, summaries), compare=False
        )
        if not outcome.held:
            log.warning("index s3://%s/%s not written yet: %s", self.bucket, key, outcome.error)
            return False
        for number in chunks_of(group):
            self._summaries.pop(number, None)
        self.written.append(group)
        return True

    def _summary_from_s3(self, chunk: int) -> ChunkSummary:
        key = contract.events_key(self.experiment, self.run, chunk)
        body: bytes = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return ChunkSummary.of(chunk, contract.records_of(body))


@dataclass
class RunIndex:
    """What a reader learns from the index: every indexed chunk's summary, and the tail's chunk keys."""

    summaries: list[ChunkSummary] = field(default_factory=list)
    tail_keys: list[str] = field(default_factory=list)
    requests: int = 0  # S3 requests it took

    @property
    def indexed_chunks(self) -> int:
        return len(self.summaries)

    @property
    def records(self) -> int:
        """Records in the indexed chunks (the tail's are counted by reading it)."""
        return sum(s.records for s in self.summaries)


def read_index(s3: Any, *, bucket: str, experiment: str, run: str, last_only: bool = False) -> RunIndex:
    """The run's index documents (only the newest with `last_only`), then the chunk keys after them."""
    found = RunIndex()
    keys: list[str] = []
    prefix = contract.run_prefix(experiment, run) + contract.INDEX + "/"
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found.requests += 1
        keys.extend(item["Key"] for item in page.get("Contents", []))
    for key in sorted(keys)[-1:] if last_only else sorted(keys):
        found.summaries.extend(contract.summaries_of(s3.get_object(Bucket=bucket, Key=key)["Body"].read()))
        found.requests += 1
    last_indexed = max((s.chunk for s in found.summaries), default=-1)
    events = contract.run_prefix(experiment, run) + contract.EVENTS + "/"
    after = contract.events_key(experiment, run, last_indexed) if last_indexed >= 0 else events
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=events, StartAfter=after):
        found.requests += 1
        found.tail_keys.extend(item["Key"] for item in page.get("Contents", []))
    return found
