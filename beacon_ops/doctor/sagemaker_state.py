"""A SageMaker training job as its orchestrator sees it: DescribeTrainingJob, read (never raising) and judged.

The verdict is the orchestrator's (check "orchestrator"), as for a Kubernetes Job: a failed job's verdict quotes
its FailureReason first, then the secondary status transitions that led there, oldest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from beacon_ops.doctor.orchestrator import CHECK
from beacon_ops.doctor.verdict import FAIL, INFO, OK, WARN, Verdict

# What the doctor keeps of DescribeTrainingJob (and carries in --json).
BEACON_ENVIRONMENT = "BeaconEnvironment"  # the doctor's own key beside DescribeTrainingJob's
BEACON_RUN_SETTINGS = ("BEACON_TEAM", "BEACON_EXPERIMENT", "BEACON_RUN_ID")
KEPT = (
    "TrainingJobName",
    "TrainingJobArn",
    "TrainingJobStatus",
    "SecondaryStatus",
    "FailureReason",
    "StoppingCondition",
    "SecondaryStatusTransitions",
    "CreationTime",
    "TrainingStartTime",
    "TrainingEndTime",
    "ResourceConfig",
    "EnableManagedSpotTraining",
)


@dataclass(frozen=True)
class TrainingJobReading:
    """One training job: what DescribeTrainingJob said (None when it said nothing) and the verdict."""

    name: str
    description: dict[str, Any] | None
    verdict: Verdict

    @property
    def beacon(self) -> dict[str, str]:
        """The Beacon run's settings in its environment (BEACON_TEAM, _EXPERIMENT, _RUN_ID); empty for a job
        without Beacon. Only these are kept of its environment: the rest may hold a team's secrets."""
        return dict((self.description or {}).get(BEACON_ENVIRONMENT, {}))


def newest_training_job(sagemaker: Any, names: list[str]) -> str:
    """The newest of a run's training jobs (`names` in the order they are made: its first, then its reruns'): the
    last one SageMaker describes before one it does not know; the first name when it knows none, or says nothing."""
    newest = names[0]
    for name in names:
        if isinstance(_describe(sagemaker, name), Verdict):
            break
        newest = name
    return newest


def read_training_job(sagemaker: Any, name: str) -> TrainingJobReading:
    """DescribeTrainingJob's answer (what the doctor keeps of it) and its verdict; or a verdict saying why none."""
    found = _describe(sagemaker, name)
    if isinstance(found, Verdict):
        return TrainingJobReading(name, None, found)
    return TrainingJobReading(name, found, training_job_verdict(found))


def _describe(sagemaker: Any, name: str) -> dict[str, Any] | Verdict:
    try:
        answer = sagemaker.describe_training_job(TrainingJobName=name)
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        message = error.response.get("Error", {}).get("Message", "")
        if code == "ValidationException" and ("not found" in message.lower() or "could not find" in message.lower()):
            return Verdict(
                CHECK,
                WARN,
                "no job",
                f"no SageMaker training job {name}: {message}",
                "check the name (aws sagemaker list-training-jobs --name-contains ...) and the region (--region)",
            )
        return Verdict(
            CHECK,
            INFO,
            "unreadable",
            f"sagemaker:DescribeTrainingJob {name}: {code}: {message}",
            "run the doctor with the team's reader role (the artifacts stack's ReaderRoleArn): it may describe the "
            "team's own training jobs, those named with the team's prefix",
        )
    except BotoCoreError as error:
        return Verdict(CHECK, INFO, "unreadable", f"sagemaker:DescribeTrainingJob {name}: {error}", "check --region")
    kept = {key: answer[key] for key in KEPT if key in answer}
    environment = answer.get("Environment") or {}
    kept[BEACON_ENVIRONMENT] = {k: str(v) for k, v in environment.items() if k in BEACON_RUN_SETTINGS}
    return kept


def _at(when: Any) -> str:
    return f" at {when:%Y-%m-%d %H:%M:%S} UTC" if isinstance(when, datetime) else ""


def _transitions(job: dict[str, Any]) -> str:
    steps = [
        f"{t.get('Status')}{_at(t.get('StartTime'))}" + (f' "{t["StatusMessage"]}"' if t.get("StatusMessage") else "")
        for t in job.get("SecondaryStatusTransitions") or []
    ]
    return " -> ".join(steps)


def training_job_verdict(job: dict[str, Any]) -> Verdict:
    """Failed: its FailureReason, quoted first. Stopped on MaxRuntimeExceeded: the stopping condition. In
    progress: its secondary status. Completed: ok."""
    name, status = job.get("TrainingJobName", "?"), job.get("TrainingJobStatus", "?")
    secondary = job.get("SecondaryStatus", "")
    history = _transitions(job)
    history_text = f"; {history}" if history else ""
    subject = f"SageMaker training job {name}"
    if status == "Failed":
        return Verdict(
            CHECK,
            FAIL,
            "training-job-failed",
            f'"{job.get("FailureReason") or "no FailureReason given"}": {subject} Failed'
            f"{_at(job.get('TrainingEndTime'))}{history_text}",
            "an AlgorithmError is the training code's own exit: the logs' verdicts below quote its last lines; a "
            "ClientError names a setting of the job (its role, image, instance type or quota) to fix before a rerun",
        )
    max_runtime = (job.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds")
    if secondary == "MaxRuntimeExceeded":
        return Verdict(
            CHECK,
            FAIL,
            "max-runtime-exceeded",
            f"{subject} Stopped: MaxRuntimeExceeded (StoppingCondition.MaxRuntimeInSeconds {max_runtime})"
            f"{history_text}",
            "raise training.sagemaker_max_runtime_seconds in the team file and redeploy; SageMaker job names are "
            "unique, so a rerun is a new run id (`beacon run --target sagemaker`), which starts from step 0",
        )
    if status == "Completed":
        return Verdict(CHECK, OK, "complete", f"{subject} Completed{_at(job.get('TrainingEndTime'))}{history_text}")
    if status == "Stopped":
        return Verdict(
            CHECK,
            WARN,
            "stopped",
            f"{subject} Stopped ({secondary}){history_text}",
            "someone or something called StopTrainingJob: aws cloudtrail lookup-events --lookup-attributes "
            "AttributeKey=EventName,AttributeValue=StopTrainingJob",
        )
    if status == "InProgress" and secondary == "Training":
        return Verdict(CHECK, OK, "running", f"{subject} InProgress (Training){history_text}")
    return Verdict(CHECK, INFO, "starting", f"{subject} {status} ({secondary}){history_text}")
