"""`--target sagemaker` of `beacon smoke` and `beacon run`: the job's image and command as a SageMaker training job.

Launched with the SageMaker SDK (sagemaker-core): the writer role as the execution role, the
checkpoint directory synced under the run prefix, metric definitions for step and loss parsed from
the job's progress lines, and a bounded run time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from beacon import contract
from botocore.exceptions import BotoCoreError, ClientError

from beacon_ops.evidence.reading import Delivery
from beacon_ops.jobs.flow import SHOW_EVERY_S, Access, JobError, JobReport, Show, TeamOutputs
from config import TeamConfig, names
from workloads import manifests

LOG_GROUP = names.SAGEMAKER_LOG_GROUP
LOG_TAIL_EVENTS = 200
PROVISIONING_ALLOWANCE_S = 900  # instance start and image download come before the run time counts
VOLUME_SIZE_GB = 30
TERMINAL = ("Completed", "Failed", "Stopped")
COMPONENT = {"beacon-smoke": "smoke-job"}  # the beacon:component tag, by the job's app name


def _value(field: Any, default: str = "") -> str:
    """sagemaker-core marks absent fields with an Unassigned object."""
    from sagemaker.core.utils.utils import Unassigned

    return default if field is None or isinstance(field, Unassigned) else str(field)


def launch(access: Access, outputs: TeamOutputs, config: TeamConfig, spec: manifests.TrainingJobSpec) -> Any:
    """The image as TrainingImage, torchrun (`beacon.launch`) as ContainerEntrypoint and the job's
    command after its arguments as ContainerArguments, InstanceCount the job's nodes."""
    from sagemaker.core.resources import Tag, TrainingJob
    from sagemaker.core.shapes import (
        AlgorithmSpecification,
        CheckpointConfig,
        MetricDefinition,
        OutputDataConfig,
        ResourceConfig,
        StoppingCondition,
    )

    container = manifests.sagemaker_container(spec)
    try:
        job_names = names.training_job_names(outputs.team, spec.name)
    except ValueError as error:
        raise JobError(f"--run: {error}") from None

    def create(job_name: str) -> Any:
        return TrainingJob.create(
            training_job_name=job_name,
            role_arn=outputs.writer_role_arn,
            algorithm_specification=AlgorithmSpecification(
                training_image=spec.image,
                training_input_mode="File",
                container_entrypoint=container.entrypoint,
                container_arguments=container.arguments,
                metric_definitions=[
                    MetricDefinition(name=name, regex=regex) for name, regex in contract.PROGRESS_LOG_METRICS.items()
                ],
            ),
            output_data_config=OutputDataConfig(s3_output_path=container.output_s3_uri, kms_key_id=outputs.kms_key_arn),
            resource_config=ResourceConfig(
                instance_type=config.training.sagemaker_instance_type,
                instance_count=spec.nodes,
                volume_size_in_gb=VOLUME_SIZE_GB,
            ),
            stopping_condition=StoppingCondition(max_runtime_in_seconds=config.training.sagemaker_max_runtime_seconds),
            checkpoint_config=CheckpointConfig(
                s3_uri=container.checkpoint_s3_uri, local_path=container.checkpoint_local_path
            ),
            environment=container.environment,
            tags=[
                Tag(key="beacon:team", value=outputs.team),
                Tag(key="beacon:component", value=COMPONENT.get(spec.app, spec.app)),
            ],
            session=access.operator,
            region=outputs.region,
        )

    sagemaker = access.operator.client("sagemaker", region_name=outputs.region)

    def status_of(job_name: str) -> str:
        try:
            return str(sagemaker.describe_training_job(TrainingJobName=job_name)["TrainingJobStatus"])
        except (ClientError, BotoCoreError):
            return ""

    return first_free(job_names, create, status_of)


def first_free(job_names: list[str], create: Callable[[str], Any], status_of: Callable[[str], str]) -> Any:
    """The run's next job: the first name SageMaker has not used (a rerun of the run), once every earlier job of
    the run ended: two jobs of one run at once would write one spool, one prefix and one run's records."""
    for job_name in job_names:
        try:
            return create(job_name)
        except ClientError as error:
            if not name_taken(error):
                raise JobError(f"SageMaker refused training job {job_name}: {error}") from None
            status = status_of(job_name)
            if status not in TERMINAL:
                raise JobError(
                    f"--run: training job {job_name} of this run is {status or 'not known to have ended'}; rerun "
                    f"it once it ended, or stop it: aws sagemaker stop-training-job --training-job-name {job_name}"
                ) from None
        except BotoCoreError as error:
            raise JobError(f"SageMaker refused training job {job_name}: {error}") from None
    raise JobError(f"--run: it ran {len(job_names)} times on SageMaker already; give a new run id")


def name_taken(error: ClientError) -> bool:
    """SageMaker's answer to a training job name it has used: names are unique in an account and region."""
    detail = error.response.get("Error", {})
    return detail.get("Code") == "ResourceInUse" or "must be unique" in str(detail.get("Message", ""))


def wait(job: Any, report: JobReport, delivery: Delivery, *, timeout_s: float, poll_s: float, show: Show) -> None:
    started, shown_at = time.monotonic(), 0.0
    while True:
        job.refresh()
        status, secondary = _value(job.training_job_status), _value(job.secondary_status)
        elapsed = time.monotonic() - started
        if time.monotonic() - shown_at >= SHOW_EVERY_S or status in TERMINAL:
            show(f"training job {status} ({secondary}) · {delivery.poll().describe()} · {elapsed:.0f} s")
            shown_at = time.monotonic()
        if status in TERMINAL:
            report.platform_state, report.platform_succeeded = status, status == "Completed"
            report.platform_detail = _value(job.failure_reason) or secondary
            return
        if elapsed > timeout_s:
            report.platform_state, report.platform_detail = "TimedOut", f"not finished within {timeout_s:.0f} s"
            return
        time.sleep(poll_s)


def collect_logs(access: Access, report: JobReport, job_name: str) -> None:
    try:
        events = access.client("logs").filter_log_events(
            logGroupName=LOG_GROUP, logStreamNamePrefix=f"{job_name}/", limit=LOG_TAIL_EVENTS
        )["events"]
        report.logs[f"{LOG_GROUP}/{job_name}"] = "\n".join(e["message"] for e in events)
    except (ClientError, BotoCoreError) as error:
        report.logs[f"{LOG_GROUP}/{job_name}"] = f"(no log: {error})"


@dataclass(kw_only=True)
class SageMakerTarget:
    """run_job's target: the job as a SageMaker training job, as the writer role."""

    access: Access
    outputs: TeamOutputs
    config: TeamConfig
    timeout_s: float | None
    poll_interval_s: float = 15.0
    name: str = "sagemaker"
    _job: Any = None

    def launch(self, spec: manifests.TrainingJobSpec, report: JobReport, show: Show) -> None:
        training = self.config.training
        show(f"creating SageMaker training job {spec.name} ({training.sagemaker_instance_type})")
        self._job = launch(self.access, self.outputs, self.config, spec)
        report.launched = {
            "training_job": self._job.training_job_name,  # a rerun of the run has a name of its own
            "instance_type": training.sagemaker_instance_type,
            "max_runtime_seconds": training.sagemaker_max_runtime_seconds,
            "image": spec.image,
            "role": self.outputs.writer_role_arn,
        }

    def wait(self, report: JobReport, delivery: Delivery, show: Show) -> None:
        bound = self.timeout_s or self.config.training.sagemaker_max_runtime_seconds + PROVISIONING_ALLOWANCE_S
        wait(self._job, report, delivery, timeout_s=bound, poll_s=self.poll_interval_s, show=show)

    def collect_logs(self, report: JobReport) -> None:
        collect_logs(self.access, report, str(self._job.training_job_name))

    def cleanup(self, report: JobReport) -> None:
        if report.platform_state not in TERMINAL:  # timed out or interrupted: no instance left billing
            try:
                self._job.stop()
            except (ClientError, BotoCoreError) as error:
                report.problems.append(f"could not stop training job {self._job.training_job_name}: {error}")
        report.cleaned_up = True
