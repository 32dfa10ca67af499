"""`beacon smoke --target sagemaker`: the same image and entry point as a SageMaker training job.

Launched with the SageMaker SDK (sagemaker-core): the writer role as the execution role, the
checkpoint directory synced under the run prefix, metric definitions for step and loss parsed from
the job's progress lines, and a bounded run time.
"""

from __future__ import annotations

import time
from typing import Any

from beacon import contract
from botocore.exceptions import BotoCoreError, ClientError

from beacon_ops.smoke import (
    SHOW_EVERY_S,
    Access,
    Delivery,
    Show,
    SmokeError,
    SmokeReport,
    TeamOutputs,
    conclude,
    fresh_spec,
    started_at,
)
from config import TeamConfig
from workloads import manifests

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
LOG_TAIL_EVENTS = 200
PROVISIONING_ALLOWANCE_S = 900  # instance start and image download come before the run time counts
VOLUME_SIZE_GB = 30
TERMINAL = ("Completed", "Failed", "Stopped")


def _value(field: Any, default: str = "") -> str:
    """sagemaker-core marks absent fields with an Unassigned object."""
    from sagemaker.core.utils.utils import Unassigned

    return default if field is None or isinstance(field, Unassigned) else str(field)


def launch(access: Access, outputs: TeamOutputs, config: TeamConfig, spec: manifests.SmokeJobSpec) -> Any:
    from sagemaker.core.resources import Tag, TrainingJob
    from sagemaker.core.shapes import (
        AlgorithmSpecification,
        CheckpointConfig,
        MetricDefinition,
        OutputDataConfig,
        ResourceConfig,
        StoppingCondition,
    )

    try:
        container = manifests.sagemaker_container(spec)
    except ValueError as error:
        raise SmokeError(f"training.smoke_{error}") from None
    run_prefix = contract.run_prefix(spec.experiment, spec.name)
    try:
        return TrainingJob.create(
            training_job_name=spec.name,
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
            output_data_config=OutputDataConfig(
                s3_output_path=f"s3://{outputs.bucket}/{run_prefix}sagemaker-output/", kms_key_id=outputs.kms_key_arn
            ),
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
            tags=[Tag(key="beacon:team", value=outputs.team), Tag(key="beacon:component", value="smoke-job")],
            session=access.operator,
            region=outputs.region,
        )
    except (ClientError, BotoCoreError) as error:
        raise SmokeError(f"SageMaker refused training job {spec.name}: {error}") from None


def wait(job: Any, report: SmokeReport, delivery: Delivery, *, timeout_s: float, poll_s: float, show: Show) -> None:
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


def collect_logs(access: Access, report: SmokeReport) -> None:
    try:
        events = access.client("logs").filter_log_events(
            logGroupName=LOG_GROUP, logStreamNamePrefix=f"{report.run}/", limit=LOG_TAIL_EVENTS
        )["events"]
        report.logs[f"{LOG_GROUP}/{report.run}"] = "\n".join(e["message"] for e in events)
    except (ClientError, BotoCoreError) as error:
        report.logs[f"{LOG_GROUP}/{report.run}"] = f"(no log: {error})"


def run_sagemaker_smoke(
    access: Access,
    outputs: TeamOutputs,
    config: TeamConfig,
    *,
    timeout_s: float | None,
    show: Show,
    poll_interval_s: float = 15.0,
) -> SmokeReport:
    spec = fresh_spec(config, outputs)
    report = SmokeReport("sagemaker", outputs.team, outputs.region, spec.name)
    began, clock = started_at(), time.monotonic()
    show(f"creating SageMaker training job {spec.name} ({config.training.sagemaker_instance_type})")
    job = launch(access, outputs, config, spec)
    report.launched = {
        "training_job": spec.name,
        "instance_type": config.training.sagemaker_instance_type,
        "max_runtime_seconds": config.training.sagemaker_max_runtime_seconds,
        "image": spec.image,
        "role": outputs.writer_role_arn,
    }
    bound = timeout_s or config.training.sagemaker_max_runtime_seconds + PROVISIONING_ALLOWANCE_S
    finished = False
    try:
        delivery = Delivery.of_run(access, outputs, spec.name)
        wait(job, report, delivery, timeout_s=bound, poll_s=poll_interval_s, show=show)
        finished = report.platform_state in TERMINAL
        conclude(
            report,
            access,
            outputs,
            delivery,
            steps=spec.steps,
            started=began,
            collect_logs=lambda failed: collect_logs(access, failed),
            show=show,
        )
    finally:
        if not finished:  # timed out or interrupted: a smoke test must not leave an instance billing
            try:
                job.stop()
            except (ClientError, BotoCoreError) as error:
                report.problems.append(f"could not stop training job {spec.name}: {error}")
        report.cleaned_up = True
        report.wall_seconds = time.monotonic() - clock
    return report
