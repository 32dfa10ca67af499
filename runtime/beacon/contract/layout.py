"""Where a run's evidence lives in S3, and what a name may be: the key layout, the id and metric-name rules,
the exit codes every room shares."""

from __future__ import annotations

import re

# --- S3 layout -------------------------------------------------------------------------
EXPERIMENTS_PREFIX = "experiments/"
EVENTS = "events"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"
PREFLIGHT = "preflight"
STATUS = "status"
PARAMS = "params"  # the run's hyperparameters, written once
RANKS = "ranks"  # every rank's progress signal and stack dumps, uploaded at the end of an attempt
# ... and during a stall, as rank 0 saw them then (`live_rank_evidence_key`); a snapshot whose files are
# all in S3 ends with this marker, written last, so a reader never takes a half-uploaded one for whole.
LIVE_SNAPSHOT = "live"
LIVE_SNAPSHOT_COMPLETE = ".complete"
# A node leader's uploads (`beacon.evidence.node_leader`), beside rank 0's: what rank 0 cannot upload because it
# stopped, or because the ranks directory is node-local (multi-node SageMaker). Same layout inside.
NODE = "node"
INDEX = "index"  # what each group of event chunks holds, so a reader finds the tail without listing them all
# Event chunks per index document: a 1,000,000-record run of 2,000 chunks has 31 of them, and a tail of 16.
INDEX_GROUP = 64
SAGEMAKER_VOLUME = "sagemaker-volume"  # SageMaker's checkpoint sync of the job's volume
# Where SageMaker itself uploads at a job's end (OutputDataConfig.S3OutputPath): <job>/output/model.tar.gz and
# output.tar.gz, by a plain PutObject or a multipart upload, never with If-None-Match.
SAGEMAKER_OUTPUT = "sagemaker-output"
# In a SageMaker job's container arguments, where torchrun's rendezvous goes: `beacon.launch` replaces it
# with this instance's, from the resource configuration SageMaker writes on every instance.
SAGEMAKER_RENDEZVOUS = "--beacon-sagemaker-rendezvous"
RENDEZVOUS_PORT = 29500  # where node 0's torchrun listens for the others, on EKS and SageMaker
# How a job's container exits when no retry can help (the Job's podFailurePolicy fails it at once): bad input
# (a setting, an argument) and a failed preflight (a sink unreachable, a spool that cannot keep records).
EXIT_BAD_INPUT = 2
EXIT_PREFLIGHT = 3
# What a diagnosis reads of a run (the doctor, the alarm's function): its records, their index, its preflights,
# its final state and its ranks' evidence; never its checkpoints (the model), TensorBoard files or hyperparameters.
DIAGNOSED_KINDS = (EVENTS, INDEX, PREFLIGHT, STATUS, RANKS)
# History that must never be overwritten: create-only writes (If-None-Match: *).
APPEND_ONLY_KINDS = (EVENTS, TENSORBOARD, PARAMS)
# What may be written without If-None-Match: checkpoints (versioning keeps old ones), the final
# status (a restart rewrites it), and what SageMaker writes itself with no conditional header: its
# checkpoint sync and its output upload.
OVERWRITABLE_KINDS = (CHECKPOINTS, STATUS, SAGEMAKER_VOLUME, SAGEMAKER_OUTPUT)

# S3-safe and Kubernetes-label-safe identifiers.
ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def whole_match(pattern: re.Pattern[str] | str, value: object) -> bool:
    """The one rule for a name's pattern: the whole value matches (`re.match` with `$` passes "r1\n")."""
    return isinstance(value, str) and re.fullmatch(pattern, value) is not None


def is_id(value: object) -> bool:
    return whole_match(ID_PATTERN, value)


def is_metric_name(value: object) -> bool:
    return whole_match(METRIC_NAME_PATTERN, value)


def validate_id(kind: str, value: str) -> str:
    if not is_id(value):
        raise ValueError(f"{kind} {value!r} must be 1-63 of a-z, 0-9 and '-', starting with a letter or digit")
    return value


def run_prefix(experiment: str, run: str) -> str:
    return f"{EXPERIMENTS_PREFIX}{experiment}/{run}/"


def events_key(experiment: str, run: str, chunk: int) -> str:
    return f"{run_prefix(experiment, run)}{EVENTS}/chunk-{chunk:08d}.jsonl"


EVENTS_CHUNK = re.compile(rf"/{EVENTS}/chunk-([0-9]+)\.jsonl$")


def chunk_of_events_key(key: str) -> int | None:
    """The chunk number an events key names (`events_key`'s inverse, written as it writes it), or None for any
    other key: a stray `chunk-5.jsonl` is not chunk 5."""
    match = EVENTS_CHUNK.search(key)
    if match is None or f"{int(match[1]):08d}" != match[1]:
        return None
    return int(match[1])


def index_key(experiment: str, run: str, group: int) -> str:
    """The index of chunks `group * INDEX_GROUP` to `(group + 1) * INDEX_GROUP - 1`, create-only, written
    once S3 holds all of them; the chunks after the last index are the run's tail."""
    return f"{run_prefix(experiment, run)}{INDEX}/index-{group:08d}.json"


def rank_evidence_key(experiment: str, run: str, attempt: int, file_name: str) -> str:
    """A rank's last progress document, stack dumps or flight-recorder dump, as the attempt left it."""
    return f"{run_prefix(experiment, run)}{RANKS}/attempt-{attempt:05d}/{file_name}"


def live_rank_evidence_key(experiment: str, run: str, attempt: int, snapshot: int, file_name: str) -> str:
    """A file of the ranks directory as rank 0 uploaded it while a rank stalled: snapshot `snapshot` of
    the attempt (0, 1, ...), create-only, beside the attempt's end-of-attempt files. Readers prefer
    those; the newest complete snapshot stands in while the attempt still hangs."""
    return rank_evidence_key(experiment, run, attempt, f"{LIVE_SNAPSHOT}-{snapshot:05d}/{file_name}")


def node_rank_evidence_key(
    experiment: str, run: str, attempt: int, node: int, file_name: str, *, snapshot: int | None = None
) -> str:
    """A file of the ranks directory as node `node`'s leader (torchrun's GROUP_RANK, LOCAL_RANK 0)
    uploaded it: at the attempt's end, or as its live snapshot `snapshot` while a rank stalled. Create-only,
    under a prefix of its own, so no node's upload can meet another's or rank 0's."""
    live = "" if snapshot is None else f"{LIVE_SNAPSHOT}-{snapshot:05d}/"
    return rank_evidence_key(experiment, run, attempt, f"{NODE}-{node:05d}/{live}{file_name}")


def tensorboard_key(experiment: str, run: str, file_name: str) -> str:
    return f"{run_prefix(experiment, run)}{TENSORBOARD}/{file_name}"


def checkpoint_key(experiment: str, run: str, step: int) -> str:
    return f"{run_prefix(experiment, run)}{CHECKPOINTS}/step-{step:08d}.pt"


def preflight_key(experiment: str, run: str, probe: str) -> str:
    return f"{run_prefix(experiment, run)}{PREFLIGHT}/{probe}"


def final_status_key(experiment: str, run: str) -> str:
    """The run's final state (`FinalState`), written at its end; a later restart rewrites it."""
    return f"{run_prefix(experiment, run)}{STATUS}/final.json"


def hyperparams_key(experiment: str, run: str) -> str:
    """The run's hyperparameters (`hyperparams_document`), create-only: a restart of the run finds the
    first attempt's values there and never replaces them."""
    return f"{run_prefix(experiment, run)}{PARAMS}/hyperparams.json"


def overwritable_resource_patterns() -> list[str]:
    """Key patterns (IAM wildcards) exempt from create-only; everything else in the bucket is.

    IAM's ``*`` matches across ``/``, so a pattern for events/ would also match SageMaker's synced
    copy of the volume (``.../sagemaker-volume/.../events/...``): the exemptions are the precise list.
    """
    return [f"{EXPERIMENTS_PREFIX}*/*/{kind}/*" for kind in OVERWRITABLE_KINDS]


# What a metric name may be: a CloudWatch metric name and a TensorBoard tag alike.
METRIC_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:/-]{1,250}")
