"""The run's index: a reader of a long run finds the tail and every chunk's summary from a few
documents, without listing or reading every chunk; a restart completes the index of the group it
continues."""

from __future__ import annotations

from pathlib import Path

import pytest
from beacon import contract
from beacon.sinks.index import IndexWriter, chunks_of, read_index

from tests.conftest import WriterSession
from tests.support.job_harness import JobHarness, keys_under
from tests.support.moto_server import MotoServer


@pytest.fixture
def harness(as_writer: WriterSession, strict_aws: str, tmp_path: Path) -> JobHarness:
    """Behind the bucket policy's conditions: an index write must be create-only, like a chunk."""
    return JobHarness(strict_aws, as_writer.bucket, tmp_path, as_writer.credentials)


def chunk_summaries(as_writer: WriterSession, run: str) -> dict[int, contract.ChunkSummary]:
    s3 = as_writer.client("s3")
    found = {}
    for key in keys_under(s3, as_writer.bucket, contract.run_prefix("smoke", run) + contract.EVENTS + "/"):
        number = int(key.rsplit("-", 1)[1].split(".")[0])
        body = s3.get_object(Bucket=as_writer.bucket, Key=key)["Body"].read()
        found[number] = contract.ChunkSummary.of(number, contract.records_of(body))
    return found


def test_a_long_run_is_indexed_per_group_of_chunks_and_its_tail_found_from_the_last_index(
    harness: JobHarness, as_writer: WriterSession
) -> None:
    # About five records per spool cycle, so more than one group of chunks in 20 s.
    steps = ("--steps", "400", "--step-sleep", "0.05", "--chunk-records", "1")
    result = harness.run("--run-id", "indexed", *steps, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    actual = chunk_summaries(as_writer, "indexed")
    groups = len(actual) // contract.INDEX_GROUP
    assert groups >= 1 and len(actual) % contract.INDEX_GROUP, f"{len(actual)} chunks: a whole group and a tail"
    indexed = groups * contract.INDEX_GROUP

    s3 = as_writer.client("s3")
    index = read_index(s3, bucket=as_writer.bucket, experiment="smoke", run="indexed")
    assert index.summaries == [actual[n] for n in range(indexed)], "each entry is what its chunk holds"
    tail = read_index(s3, bucket=as_writer.bucket, experiment="smoke", run="indexed", last_only=True)
    assert tail.tail_keys == [contract.events_key("smoke", "indexed", n) for n in range(indexed, len(actual))]
    assert tail.requests <= 3, "one listing of the index, one document, one listing of the tail"
    in_tail = sum(actual[n].records for n in range(indexed, len(actual)))
    assert index.records + in_tail == 400, "the index and the tail hold every record"


def test_a_restart_completes_the_group_an_earlier_process_began_from_what_s3_holds(moto_server: MotoServer) -> None:
    """The first process acknowledged chunks 0-9 and died; the next one acknowledges the rest of the
    group: the group's index holds all of them, the first ten read back from S3."""
    s3 = moto_server.client("s3")
    s3.create_bucket(Bucket="index-test")
    records = [contract.Record("e", "r", step, {"loss": 1.0}, 1.0, seq=step) for step in range(3 * 70)]
    chunks = [records[3 * n : 3 * n + 3] for n in range(70)]
    for number, chunk in enumerate(chunks):
        body = b"".join(r.to_line() for r in chunk)
        s3.put_object(Bucket="index-test", Key=contract.events_key("e", "r", number), Body=body)
    earlier = IndexWriter(s3, bucket="index-test", experiment="e", run="r")
    for number in range(10):
        earlier.acknowledged(contract.ChunkSummary.of(number, chunks[number]))
    assert earlier.written == []
    later = IndexWriter(s3, bucket="index-test", experiment="e", run="r")
    for number in range(10, 70):
        later.acknowledged(contract.ChunkSummary.of(number, chunks[number]))
    assert later.written == [0], "group 0 is whole at chunk 63; group 1 is the tail"
    index = read_index(s3, bucket="index-test", experiment="e", run="r")
    assert index.summaries == [contract.ChunkSummary.of(n, chunks[n]) for n in chunks_of(0)]
    assert index.tail_keys == [contract.events_key("e", "r", n) for n in range(64, 70)]
    again = IndexWriter(s3, bucket="index-test", experiment="e", run="r")
    again.acknowledged(contract.ChunkSummary.of(63, chunks[63]))
    assert again.written == [0], "a group written before is taken as written (create-only), not an error"
