"""The release before the one-log redesign (tag `pre-one-log`), installed apart, beside this runtime: the same
loop (bench/loop.py `sustained`), the two interleaved in one run, reported as ratios (issue 29). A ratio of two
things measured in the same run is what survives a busier machine; each side's own figures are kept beside it."""

from __future__ import annotations

import gzip
import os
import shutil
import statistics
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from bench.trackers import bench_sustained

ROOT = Path(__file__).resolve().parent.parent
RELEASE_TAG = "pre-one-log"
# The release's `runtime/` as `git archive` wrote it (its commit in the tar's pax comment): CI's clone carries no
# tags and may carry no history, so the bench never asks git for the release. `python -m bench.release` rewrites it.
RELEASE_ARCHIVE = ROOT / "bench" / "fixtures" / f"{RELEASE_TAG}.tar.gz"


def release_commit(archive: Path = RELEASE_ARCHIVE) -> str:
    """The commit the archive was made from, as `git get-tar-commit-id` reads it."""
    try:
        with tarfile.open(archive) as tar:
            commit = tar.pax_headers.get("comment", "")
    except (OSError, tarfile.TarError) as error:
        raise RuntimeError(f"bench: the release archive {archive} is unreadable: {error}") from error
    if len(commit) != 40:
        raise RuntimeError(f"bench: the release archive {archive} names no commit (made by `git archive`?)")
    return commit


def install_release(archive: Path = RELEASE_ARCHIVE) -> Path:
    """The release's `runtime/` directory (its `beacon` package), extracted once under .beacon/ from the archive."""
    commit = release_commit(archive)
    target = ROOT / ".beacon" / "bench-release" / commit[:12]
    if not (target / "runtime" / "beacon" / "__init__.py").exists():
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with tarfile.open(archive) as tar:
            tar.extractall(partial, filter="data")
        partial.rename(target)
    return target / "runtime"


def pack_release(tag: str = RELEASE_TAG, archive: Path = RELEASE_ARCHIVE) -> str:
    """Writes the archive from the tag (a maintainer's step, in a clone that has it); returns the commit."""
    packed = subprocess.run(["git", "archive", "--format=tar", tag, "runtime"], cwd=ROOT, capture_output=True)
    if packed.returncode != 0:
        raise RuntimeError(f"bench: git tag {tag!r} not found: {packed.stderr.decode().strip()}")
    archive.write_bytes(gzip.compress(packed.stdout, compresslevel=9, mtime=0))
    return release_commit(archive)


def with_runtime(env: dict[str, str], runtime: Path | None) -> dict[str, str]:
    """`env` whose `import beacon` is `runtime`'s (first on the path), or this checkout's when None."""
    if runtime is None:
        return env
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, (str(runtime), env.get("PYTHONPATH", ""))))}


def bench_against_release(
    env: dict[str, str], *, s3_endpoint: str, bucket: str, rounds: int = 3, records: int = 300_000
) -> dict[str, Any]:
    """`rounds` sustained runs of each runtime, alternating which goes first: records/s S3 acknowledged and the
    time inside `run.log`, each side's median, and the redesign's over the release's."""
    release = install_release()
    rate: dict[str, list[float]] = {"release": [], "redesign": []}
    log_ms: dict[str, list[float]] = {"release": [], "redesign": []}
    for round_ in range(rounds):
        order = [("release", release), ("redesign", None)]
        for name, runtime in order if round_ % 2 == 0 else order[::-1]:
            report = bench_sustained(
                with_runtime(env, runtime), s3_endpoint=s3_endpoint, bucket=bucket, records=records, outage_s=0
            )
            if not report["sustained_delivered"]:
                raise RuntimeError(f"bench: the {name} runtime did not deliver every record")
            if (Path(report["sustained_runtime"]).is_relative_to(release.parent)) != (runtime is not None):
                raise RuntimeError(f"bench: the {name} side ran the beacon of {report['sustained_runtime']}")
            rate[name].append(report["sustained_records_per_s"])
            log_ms[name].append(report["sustained_ms_per_log"])
    median = {name: statistics.median(values) for name, values in rate.items()}
    median_ms = {name: statistics.median(values) for name, values in log_ms.items()}
    return {
        "release": {"tag": RELEASE_TAG, "commit": release_commit()},
        "release_sustained_records_per_s": median["release"],
        "redesign_sustained_records_per_s": median["redesign"],
        "sustained_records_per_s_ratio": median["redesign"] / median["release"],
        "release_log_ms_per_step": median_ms["release"],
        "redesign_log_ms_per_step": median_ms["redesign"],
        "log_ms_per_step_ratio": median_ms["redesign"] / median_ms["release"],
        "against_release_rounds": {"records": records, "rounds": rounds, "records_per_s": rate, "log_ms": log_ms},
    }


if __name__ == "__main__":
    print(f"bench: {RELEASE_ARCHIVE.relative_to(ROOT)} holds {RELEASE_TAG} = {pack_release()}")
