"""`beacon run`: a team's own job (its image, its command) on its deployed stack, followed and proved
as `beacon smoke` proves the smoke job."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from beacon_ops.cli.common import REGION_HELP, fail, session_or_fail, team_or_fail
from beacon_ops.cli.follow import (
    AsJson,
    KubernetesUrl,
    PollInterval,
    StartTimeout,
    Where,
    finish,
    live_line,
    make_target,
)


def environment_pairs(values: list[str], *, as_json: bool) -> tuple[tuple[str, str], ...]:
    pairs = []
    for value in values:
        name, sep, setting = value.partition("=")
        if not sep or not name or name.startswith(("BEACON_", "AWS_")):
            raise fail("run", f"--env: {value!r} must be NAME=VALUE, not a BEACON_* or AWS_* name", as_json=as_json)
        pairs.append((name, setting))
    return tuple(pairs)


def run(
    team: Annotated[str, typer.Option(envvar="BEACON_TEAM", help="team name (config/teams/<team>.toml)")],
    image: Annotated[
        str,
        typer.Option(help="the job's image: :TAG or @sha256:DIGEST in the team's ECR repository, or a full reference"),
    ],
    command: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="CMD", help="after --: what torchrun runs, a script and its arguments or -m and a module"
        ),
    ] = None,
    nodes: Annotated[int, typer.Option(help="nodes (pods), each running torchrun")] = 1,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node, one rank each; 0: one rank on a CPU node")] = 0,
    target: Annotated[Where, typer.Option(envvar="BEACON_RUN_TARGET", help="where the job runs")] = Where.EKS,
    experiment: Annotated[
        str, typer.Option(envvar="BEACON_EXPERIMENT", help="the experiment the job's beacon.init writes under")
    ] = "default",
    run_id: Annotated[
        str | None, typer.Option("--run", help="run id and Job name (default: the experiment and the time)")
    ] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="NAME=VALUE for the job, repeatable")] = None,
    steps: Annotated[
        int | None, typer.Option(min=1, help="require exactly steps 0..N-1 in S3 (default: every record logged)")
    ] = None,
    region: Annotated[str | None, typer.Option(help=REGION_HELP)] = None,
    report_path: Annotated[
        Path | None,
        typer.Option("--report", envvar="BEACON_RUN_REPORT", help="JSON report (default .beacon/run/RUN.json)"),
    ] = None,
    kubernetes_url: KubernetesUrl = None,
    start_timeout: StartTimeout = 900,
    timeout: Annotated[
        float | None, typer.Option(min=1, help="seconds to follow the run (default: eks 1800, sagemaker max run + 900)")
    ] = None,
    keep: Annotated[
        bool, typer.Option(help="never delete or stop the job, even when the command stops following it")
    ] = False,
    poll_interval: PollInterval = 5.0,
    as_json: AsJson = False,
) -> None:
    """Run a team's own job on its stack (write CMD after --), follow it, and prove what it delivered."""
    from beacon_ops.evidence.verify import Expected
    from beacon_ops.jobs.flow import Access, JobError, read_outputs, run_job
    from beacon_ops.jobs.team import (
        TeamJobRequest,
        check_request,
        check_sagemaker_gpus,
        in_team_repository,
        instance_gpus,
        team_job,
    )

    config = team_or_fail("run", team, as_json=as_json)
    request = TeamJobRequest(
        image=image,
        command=tuple(command or ()),
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        target=target.value,
        experiment=experiment,
        run=run_id,
        environment=environment_pairs(env or [], as_json=as_json),
    )
    try:
        check_request(request, config)
    except JobError as error:
        raise fail("run", str(error), as_json=as_json) from None
    session = session_or_fail("run", region=region, config=config, as_json=as_json)
    region = str(session.region_name)
    if target is Where.SAGEMAKER:
        gpus = instance_gpus(session.client("ec2"), config.training.sagemaker_instance_type)
        try:
            check_sagemaker_gpus(request, config, gpus)
        except JobError as error:
            raise fail("run", str(error), as_json=as_json) from None
    with live_line("run", team, region, as_json=as_json) as show:
        outputs = read_outputs(session.client("cloudformation"), team, region)
        job = team_job(request, config, outputs)
        own_image = in_team_repository(job.image, outputs)
        if not own_image:  # allowed: but the node role (or SageMaker's execution role) must be able to pull it
            show(f"note: the image is not in the team's repository {outputs.image_repository_uri}")
        access = Access.open(session, outputs.reader_role_arn)
        where = make_target(
            target,
            access=access,
            outputs=outputs,
            config=config,
            kubernetes_url=kubernetes_url,
            start_timeout=start_timeout,
            timeout=timeout,
            keep=keep,
            keep_ended=True,
            poll_interval=poll_interval,
        )
        report = run_job(where, access, outputs, job, Expected.own_job(steps), show=show, command="run")
        report.launched["image_in_team_repository"] = own_image
    finish(report, report_path or Path(".beacon/run") / f"{report.run}.json", as_json=as_json)
