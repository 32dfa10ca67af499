"""Compose every stack of one team into an app, with cdk-nag enforced."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import App, Environment, Validations
from cdk_nag import AwsSolutionsChecks

from beacon_constructs.tagging import tag_team
from config import TeamConfig
from stacks.artifacts import ArtifactsStack
from stacks.monitoring import MonitoringStack


@dataclass(frozen=True)
class BeaconStacks:
    artifacts: ArtifactsStack
    monitoring: MonitoringStack


def stack_name(config: TeamConfig, component: str) -> str:
    return f"beacon-{config.team}-{component}"


def cluster_name(config: TeamConfig) -> str:
    return f"beacon-{config.team}"


def build_app(app: App, config: TeamConfig) -> BeaconStacks:
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    tag_team(app, config.team)
    # The demo team synthesizes env-agnostic: no account, no lookups, no credentials.
    env = Environment(account=config.account, region=config.region) if config.account else None
    artifacts = ArtifactsStack(
        app,
        stack_name(config, "artifacts"),
        config=config,
        env=env,
        description=f"Beacon {config.team}: artifact store (stateful, retained)",
        termination_protection=config.account is not None,
    )
    monitoring = MonitoringStack(
        app,
        stack_name(config, "monitoring"),
        config=config,
        cluster_name=cluster_name(config),
        writer_role=artifacts.store.writer_role,
        env=env,
        description=f"Beacon {config.team}: alarms, dashboard and alarm topic",
    )
    return BeaconStacks(artifacts=artifacts, monitoring=monitoring)
