"""Compose every stack of one team into an app, with cdk-nag enforced."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import App, DefaultStackSynthesizer, Environment, Validations
from cdk_nag import AwsSolutionsChecks

from beacon_constructs.tagging import tag_team
from config import TeamConfig, names
from stacks.artifacts import ArtifactsStack
from stacks.cluster import ClusterStack
from stacks.monitoring import MonitoringStack
from stacks.network import NetworkStack


@dataclass(frozen=True)
class BeaconStacks:
    network: NetworkStack
    artifacts: ArtifactsStack
    cluster: ClusterStack
    monitoring: MonitoringStack


def stack_name(config: TeamConfig, component: str) -> str:
    return names.stack_name(config.team, component)


def cluster_name(config: TeamConfig) -> str:
    return names.cluster_name(config.team)


def build_app(app: App, config: TeamConfig) -> BeaconStacks:
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    tag_team(app, config.team)
    # The demo team synthesizes env-agnostic: no account, no lookups, no credentials.
    env = Environment(account=config.account, region=config.region) if config.account else None
    if config.account:
        # The answer CDK's AZ lookup would fetch, from the team file: synth stays offline.
        app.node.set_context(
            f"availability-zones:account={config.account}:region={config.region}", list(config.availability_zones())
        )
    name = cluster_name(config)

    def describe(what: str) -> str:
        return f"Beacon {config.team}: {what}"

    network = NetworkStack(
        app,
        stack_name(config, "network"),
        config=config,
        cluster_name=name,
        env=env,
        description=describe("VPC, flow logs and endpoints"),
    )
    artifacts = ArtifactsStack(
        app,
        stack_name(config, "artifacts"),
        config=config,
        vpc=network.network.vpc,
        volume_subnets=network.network.node_subnets,
        node_security_group=network.network.node_security_group,
        env=env,
        description=describe("artifact store and volume (stateful, retained)"),
        termination_protection=config.account is not None,
    )
    cluster = ClusterStack(
        app,
        stack_name(config, "cluster"),
        config=config,
        cluster_name=name,
        vpc=network.network.vpc,
        node_subnets=network.network.node_subnets,
        writer_role=artifacts.store.writer_role,
        bucket=artifacts.store.bucket,
        file_system=artifacts.volume.file_system,
        access_point=artifacts.volume.access_point,
        env=env,
        description=describe("EKS, Karpenter, training namespace and smoke Job"),
        # Its image asset (the smoke image) goes into the team's smoke repository, which the artifacts stack holds.
        # `cdk deploy` (CLI 2.1148) publishes a stack's assets after the stacks it depends on are deployed; a first
        # deploy of this stack alone (`--exclusively`) needs the artifacts stack deployed before.
        synthesizer=DefaultStackSynthesizer(image_assets_repository_name=names.smoke_image_repository(config.team)),
    )
    monitoring = MonitoringStack(
        app,
        stack_name(config, "monitoring"),
        config=config,
        cluster_name=name,
        writer_role=artifacts.store.writer_role,
        bucket=artifacts.store.bucket,
        verdict_role=artifacts.store.verdict_role,
        verdict_reader_role=artifacts.store.verdict_reader_role,
        env=env,
        description=describe("alarms, dashboard, alarm topic and the alarm's verdict"),
    )
    return BeaconStacks(network=network, artifacts=artifacts, cluster=cluster, monitoring=monitoring)
