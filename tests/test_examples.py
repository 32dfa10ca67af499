"""The three examples in examples/ run as written, against the strict embedded AWS, with tiny settings
(BEACON_* and their own flags): every step they log lands in S3 once, and the run ends `finished`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from beacon import contract

from tests.conftest import WriterSession
from tests.support.job_harness import JobHarness
from tests.support.synth import ROOT
from tests.test_integrations import environment, records_by_step, run_job, s3_json

EXAMPLES = ROOT / "examples"


@pytest.fixture
def harness(as_writer: WriterSession, strict_aws: str, tmp_path: Path) -> JobHarness:
    return JobHarness(strict_aws, as_writer.bucket, tmp_path, as_writer.credentials)


def final(writer: WriterSession, experiment: str, run: str) -> dict[str, object]:
    return s3_json(writer, contract.final_status_key(experiment, run))


def test_plain_ddp_under_torchrun_on_two_ranks(harness: JobHarness, as_writer: WriterSession) -> None:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    command = [torchrun, "--standalone", "--nproc-per-node=2", str(EXAMPLES / "plain_ddp.py"), "--steps", "12"]
    done = run_job([*command, "--checkpoint-every", "5"], environment(harness, "ddp-example"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "finished: last step 11, 12 records" in done.stdout, "rank 0 alone reports"
    assert sorted(records_by_step(as_writer, "plain-ddp", "ddp-example")) == list(range(12))
    ended = final(as_writer, "plain-ddp", "ddp-example")
    assert (ended["state"], ended["world_size"]) == ("finished", 2)


def test_lightning_module(harness: JobHarness, as_writer: WriterSession, tmp_path: Path) -> None:
    command = [sys.executable, str(EXAMPLES / "lightning_module.py"), "--epochs", "1", "--root", str(tmp_path)]
    done = run_job(command, environment(harness, "pl-example"))
    assert done.returncode == 0, done.stderr[-3000:]
    records = records_by_step(as_writer, "lightning-example", "pl-example")
    assert sorted(records) == list(range(8)) and "val_loss" in records[7]
    assert final(as_writer, "lightning-example", "pl-example")["state"] == "finished"
    assert (tmp_path / "lightning-example" / "pl-example" / "checkpoints" / "epoch=0-step=8.ckpt").is_file()


def test_hf_trainer(harness: JobHarness, as_writer: WriterSession, tmp_path: Path) -> None:
    command = [sys.executable, str(EXAMPLES / "hf_trainer.py"), "--steps", "4", "--every", "2"]
    done = run_job([*command, "--output-dir", str(tmp_path / "trainer")], environment(harness, "hf-example"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(records_by_step(as_writer, "hf-example", "hf-example")) == [1, 2, 3, 4]
    ended = final(as_writer, "hf-example", "hf-example")
    assert (ended["state"], ended["checkpoints"]) == ("finished", [2, 4])
