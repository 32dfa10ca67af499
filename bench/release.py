"""The release before the one-log redesign (tag `pre-one-log`), installed apart, beside this runtime: the same
loop (bench/loop.py `sustained`), the two interleaved in one run, reported as ratios (issue 29). A ratio of two
things measured in the same run is what survives a busier machine; each side's own figures are kept beside it."""

from __future__ import annotations

import io
import os
import statistics
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from bench.trackers import bench_sustained

ROOT = Path(__file__).resolve().parent.parent
RELEASE_TAG = "pre-one-log"


def release_commit(tag: str = RELEASE_TAG) -> str:
    done = subprocess.run(["git", "rev-parse", f"{tag}^{{commit}}"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bench: git tag {tag!r} not found ({done.stderr.strip()}); fetch the repository's tags")
    return done.stdout.strip()


def install_release(tag: str = RELEASE_TAG) -> Path:
    """The release's `runtime/` directory (its `beacon` package), extracted once under .beacon/ from git itself."""
    commit = release_commit(tag)
    target = ROOT / ".beacon" / "bench-release" / commit[:12]
    if not (target / "runtime" / "beacon" / "__init__.py").exists():
        archive = subprocess.run(["git", "archive", "--format=tar", commit, "runtime"], cwd=ROOT, capture_output=True,
                                 check=True).stdout  # fmt: skip
        partial = target.with_name(target.name + ".partial")
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(partial, filter="data")
        partial.rename(target)
    return target / "runtime"


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
